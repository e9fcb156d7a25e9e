"""One run of `make bench`, whatever it runs: the setup, the records' writer and the teardown
that blocks (bench/run/runner.py) and the load-response sweep (bench/run/sweep.py) share, so
the two cannot drift apart.

In order: the run's own settings on RESUME; the profile; what the run's source opens (its kind,
bench/run/source.py: the task, the box and the arms' history files, or the recordings); the
fingerprint (a resumed run must be the same run); the run folder; then,
under the stop handlers (Ctrl-C, SIGTERM, the watchdog, unwritable records): the server, the
compressors, the self-check, the arms, the model settings every arm request uses, the manifest,
the writer; then the kind's own work (blocks or cells); then the report, still under the
handlers, so a late Ctrl-C leaves neither a server running nor a report half-written.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings
from compaction_bench.bench.run.compressors import open_compressors
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.manifest import build_manifest, history_hashes, replica_shares
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.resume import (
    boot_id,
    clock_fields,
    fingerprint,
    open_run,
    resumed_config,
    resumed_origin,
)
from compaction_bench.bench.run.source import Opened, SourceKind
from compaction_bench.bench.run.sources import default_source, kind_of, with_source_defaults
from compaction_bench.bench.run.stop import RunStop
from compaction_bench.bench.run.telemetry import measured_router, selfcheck
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord, write_json
from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.files import RecordWriteError
from compaction_bench.histories.agent.chat import ChatModelConfig, config_for_profile
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.tasks.task import Task
from compaction_bench.serve.endpoints import server_version
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.serve.launcher import ServerConfig, server_for
from compaction_bench.serve.profile import Profile, resolve_profile

DEFAULT_KV_BLOCK = 16  # vLLM's KV block size where a profile sets none


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    records: list[ArmRecord]
    report: Any  # what the report callback returned (the report's files), or None
    aborted: str | None
    exit_code: ExitCode = ExitCode.OK  # FAILED, or INTERRUPTED for a signal


@dataclass
class Session:
    """What the kind's work gets: everything set up, and where records go."""

    config: BenchConfig
    profile: Profile
    kind: SourceKind  # where the continuations come from (bench/run/source.py)
    opened: Opened  # what it opened: the task and box, or the recordings
    run_id: str
    run_dir: Path
    manifest: dict[str, Any] | None  # the resumed run's manifest; None until a new one is made
    origin: float
    stop: RunStop
    phases: PhaseLog
    stream: TextIO
    url: str = ""
    arms: list[Arm] = field(default_factory=list)
    model: ChatModelConfig | None = None
    settings: BlockSettings | None = None

    @property
    def task(self) -> Task | None:
        """The agents' task (None where no agent runs)."""
        return self.opened.task

    @property
    def confinement(self) -> str:
        """What confines the agents' commands, for the banner."""
        if self.opened.sandbox is None:
            return f"nothing ({self.kind.name} runs no agent commands)"
        return self.opened.sandbox.level

    @property
    def hint(self) -> str:
        return f"finished records are in {self.run_dir}; continue with RESUME={self.run_id}"

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def writer(self) -> RunWriter:
        """The run's record writer; records that cannot be written stop the run at once."""
        def unwritable(exc: RecordWriteError) -> None:
            self.stop.stop(f"{exc}".splitlines()[0] + "; free space or fix the folder, then "
                           f"continue with RESUME={self.run_id}")

        writer = RunWriter(self.run_dir, self.origin, on_failure=unwritable)
        self.stop.on_stop = writer.cancel
        return writer


class RunKind(Protocol):
    """What a run does between setup and teardown: blocks, or the sweep's cells."""

    name: str

    def adjust(self, config: BenchConfig, profile: Profile, source: SourceKind) -> BenchConfig:
        """The config this kind runs with from `source` (the sweep's CPU arms and step
        limit)."""
        ...

    def prints(self, config: BenchConfig, profile: Profile) -> dict[str, Any]:
        """What the fingerprint holds beyond the shared fields."""
        ...

    def prepare(self, session: Session) -> dict[str, Any]:
        """Work before the manifest (a service probe); returns the manifest's own fields:
        `users` and `blocks` for `build_manifest`, the rest added as they are."""
        ...

    def run(self, session: Session) -> tuple[list[ArmRecord], str | None]:
        """The kind's work: (records, why it ended early or None). Stops by `session.stop`."""
        ...


Report = Callable[[Path, int], Any]
# The routing comparison of one run per policy (base run id, policy -> run folder in the order
# they ran, what is missing, seed) written, returning its path and text: a document, so the CLI
# passes it (bench.report.routing.compare_policies), as it passes `Report`.
Compare = Callable[[str, Mapping[str, Path], Mapping[str, str], int], tuple[Path, str]]


def run_session(config: BenchConfig, kind: RunKind, *, stream: TextIO = sys.stderr,
                report: Report | None = None) -> RunOutcome:
    """Set up, run `kind`, tear down and (when anything was recorded) call `report(run_dir,
    seed)`; see the module docstring. Known failures before the run starts raise
    `SuiteError`; after it started they end the run with `aborted` set."""
    config = resumed_config(config)
    profile = resolve_profile(config.profile)
    if (config.speculative is not None or config.expert_parallel is not None
            or config.kv_offload is not None):
        profile = profile.with_features(speculative=config.speculative,
                                        kv_offload=config.kv_offload,
                                        expert_parallel=config.expert_parallel)
    source = kind_of(config.source or default_source(profile))
    config = with_source_defaults(kind.adjust(config, profile, source), profile)
    opened = source.open(config)
    config = opened.config
    prints = {**fingerprint(config, profile, opened.paths), **kind.prints(config, profile),
              **source.fingerprint(opened)}
    run_id, run_dir, manifest = open_run(config, prints)
    origin = (resumed_origin(manifest, boot=boot_id(), monotonic_now=time.monotonic(),
                             wall_now=time.time()) if manifest else time.monotonic())
    session = Session(config=config, profile=profile, kind=source, opened=opened,
                      run_id=run_id, run_dir=run_dir, manifest=manifest, origin=origin,
                      stop=RunStop(), phases=PhaseLog(run_dir, origin), stream=stream)
    records: list[ArmRecord] = []
    aborted: str | None = None
    found = None
    invoked = time.monotonic()
    with session.stop.signals(stream):
        try:
            with ExitStack() as stack:
                _setup(session, stack, prints, kind)
                records, aborted = kind.run(session)
        except BaseException:
            if manifest is None:  # a new run that failed before it wrote anything (a dead
                with contextlib.suppress(OSError):  # server) leaves no empty folder behind
                    run_dir.rmdir()  # never a folder with anything in it
            raise
        session.phases.add("invocation", invoked, time.monotonic())  # up to the report
        if session.stop.reason is not None:
            aborted = session.stop.reason.message
            if "RESUME=" not in aborted:
                aborted += f"; {session.hint}"
        if report is not None and (records or (run_dir / "arms.jsonl").is_file()):
            try:
                found = report(run_dir, config.seed)
            except (OSError, SuiteError) as exc:  # a full disk: the records are safe
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                aborted = ((aborted + "; ") if aborted else "") + (
                    f"the report could not be written ({why.splitlines()[0]}); once fixed, "
                    f"`make report RUN={run_id}` writes it from the records")
    reason = session.stop.reason
    code = (reason.exit_code if reason is not None
            else ExitCode.FAILED if aborted else ExitCode.OK)
    return RunOutcome(run_dir=run_dir, records=records, report=found, aborted=aborted,
                      exit_code=code)


def _setup(session: Session, stack: ExitStack, prints: dict[str, Any], kind: RunKind) -> None:
    """Server, compressors, self-check, arms, model settings, manifest, block settings."""
    config, profile, phases = session.config, session.profile, session.phases
    with phases.phase("server_start"):
        session.url = stack.enter_context(server_for(
            ServerConfig(profile=profile, port=config.port, fast_start=config.fast_start),
            config.base_url))
    compressors = stack.enter_context(open_compressors(
        config, profile, session.url, session.run_dir, session.origin, phases,
        needed=session.kind.compressors(session.opened)))
    with phases.phase("selfcheck"):
        check = selfcheck(config, session.url, profile, session.run_dir)
    setup = session.kind.setup(session.opened, profile, session.url, compressors, phases)
    session.arms = setup.arms
    model = config_for_profile(profile, session.url, config.seed).model_copy(
        update={"request_timeout_s": config.stream_deadline_s})
    if config.token_ids:  # prompt and completion ids come back: cache-break accounting
        model = model.model_copy(update={"extra_body": {**model.extra_body,
                                                        **dialect.token_ids()}})
    session.model = model
    extra = kind.prepare(session)
    if session.manifest is None:
        manifest = build_manifest(
            config, profile, run_id=session.run_id, api_url=session.url,
            server_version=server_version(session.url),
            histories=history_hashes(session.opened.paths), users=int(extra.pop("users")),
            blocks=int(extra.pop("blocks")))
        manifest.update({**clock_fields(session.origin), "fingerprint": prints,
                         "structured_text": model.structured_text, "selfcheck": check,
                         **setup.manifest, **_router(config), **extra})
        manifest["server"]["replicas"] = replica_shares(config, session.url)
        write_json(session.run_dir / "manifest.json", manifest)
        session.manifest = manifest
    session.settings = BlockSettings(
        config=config, run_id=session.run_id, source=setup.source, model=model,
        protocol=config.protocol_for(profile),
        block_size=profile.engine_args.block_size or DEFAULT_KV_BLOCK,
        ledger=Ledger(session.run_dir / "ledger.jsonl"),
        # CACHE=run and isolated salts: unique to this run (its clock origin, which the
        # manifest keeps for RESUME), so a rerun under the same RUN_ID starts cold
        run_salt=f"{session.run_id}-{session.origin:.6f}", records=setup.records,
        served_names=tuple(dict.fromkeys((model.model_name, *profile.model.served_names))))


def _router(config: BenchConfig) -> dict[str, Any]:
    """The manifest's `router` where the run goes through one it did not start (a per-policy
    run's own, from bench/run/routing.py, replaces it)."""
    found = measured_router(config)
    return {"router": found} if found else {}
