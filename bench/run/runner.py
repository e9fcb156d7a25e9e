"""`make bench`: blocks of arms of one task under one regime, recorded into a run folder.

The run folder gets its manifest first, then raw records appended as they happen (arms,
requests, blocks, server metrics, GPU telemetry, the background load's state), then
`summary.json` and the report from the same analysis code as `make report`.

Trust, in order: a run that resumes must be the same run (`fingerprint`); the server must answer
before anything starts; the background load is measured for pacing, started, steady, and checked
at every block boundary while a monitor samples it during blocks; every block's load figures and
validity go into `blocks.jsonl`; `RESUME=<run-id>` re-runs every block that lacks a record of
some arm; `--recover` re-runs failed arms as recovery runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from bench.analysis.load import block_load
from bench.analysis.runfolder import (
    ArmRecord,
    BlockRecord,
    load_manifest,
    manifest_field,
    read_run,
    write_json,
)
from bench.report.run_report import ReportFiles, write_report
from bench.run.arm import Arm, arm_for
from bench.run.block import BlockSettings, run_block
from bench.run.config import PLACEBO, SWEEP, BenchConfig, default_blocks, regime_users
from bench.run.manifest import build_manifest, history_hashes
from bench.run.phases import PhaseLog
from bench.run.progress import Progress
from bench.run.stop import RunStop
from bench.run.watchdog import Watchdog
from bench.run.writer import RunWriter
from common.errors import ExitCode, SuiteError
from common.files import JsonlWriter, RecordWriteError
from common.paths import histories_root
from histories.agent.chat import config_for_profile
from histories.agent.sandbox import confinement
from histories.compaction.compactor import (
    CompactionCache,
    CompressorConfig,
    external_compressor,
    self_compressor,
)
from histories.compaction.ledger import Ledger
from histories.compaction.prompts import REWRITE_PROMPTS
from histories.format.history import load_history
from histories.tasks.task import load_task
from loadgen.background import BackgroundLoad, BackgroundLoadError, ServiceProbe
from loadgen.metrics import MetricsSampler
from serve.launcher import LazyServer, ServerConfig, is_healthy, server_for, server_version
from serve.profile import EXTERNAL_COMPRESSOR_PROFILE, Profile, load_profile, resolve_profile

LOAD_SAMPLE_S = 0.5  # how often the monitor samples the background load's state
DEFAULT_KV_BLOCK = 16  # vLLM's KV block size where a profile sets none


class BenchError(SuiteError):
    """A run cannot start or had to stop; the message says why and what to do."""


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    records: list[ArmRecord]
    report: ReportFiles | None
    aborted: str | None
    exit_code: ExitCode = ExitCode.OK  # FAILED, or INTERRUPTED for a signal


def history_paths(task: str, arms: tuple[str, ...]) -> dict[str, Path]:
    """Each arm's history file; `placebo` is clean's very file under another name."""
    root = histories_root() / task
    paths = {arm: root / f"{'clean' if arm == PLACEBO else arm}.json" for arm in arms}
    missing = sorted({str(p) for p in paths.values() if not p.is_file()})
    if missing:
        raise BenchError(f"missing arm histories: {', '.join(missing)}; make them with "
                         f"`make histories TASK={task}`")
    return paths


def fingerprint(config: BenchConfig, profile: Profile, paths: dict[str, Path]) -> dict[str, Any]:
    """What makes two runs the same run: a RESUME must match it field by field."""
    return {"regime": config.regime, "task": config.task, "arms": list(config.arms),
            "seed": config.seed, "seeds": config.seeds, "cache": config.cache,
            "protocol": config.protocol_for(profile), "rewrite_cache": config.rewrite_cache,
            "profile": profile.name, "step_limit": config.step_limit, "prompt": config.prompt,
            "fast_start": config.fast_start,
            "histories": {a: hashlib.sha256(p.read_bytes()).hexdigest()
                          for a, p in paths.items()}}


def _differences(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(was) | set(now)):
        if was.get(key) != now.get(key):
            if key == "histories":
                changed = sorted(a for a in set(was[key] or {}) | set(now[key] or {})
                                 if (was[key] or {}).get(a) != (now[key] or {}).get(a))
                out.append(f"history files of {', '.join(changed)} changed (sha256)")
            else:
                out.append(f"{key} (run: {was.get(key)!r}, now: {now.get(key)!r})")
    return out


def open_run(config: BenchConfig, prints: dict[str, Any]
             ) -> tuple[str, Path, dict[str, Any] | None]:
    """(run id, folder, existing manifest or None). A new run id is regime + UTC time; a
    resumed run must have the same fingerprint, or it is refused naming what changed."""
    results = Path(config.results_dir)
    if config.resume:
        run_dir = results / config.resume
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.is_file():
            known = sorted(p.parent.name for p in results.glob("*/manifest.json"))
            raise BenchError(f"cannot resume {config.resume}: {manifest_path} does not exist "
                             f"(runs in {results}: {', '.join(known) or 'none'})")
        manifest = load_manifest(manifest_path)  # what resuming reads is checked up front
        manifest_field(manifest, manifest_path, "config.regime", str)
        manifest_field(manifest, manifest_path, "regime.blocks", int)
        manifest_field(manifest, manifest_path, "clock_origin_monotonic", (int, float))
        was = manifest.get("fingerprint")
        if not isinstance(was, dict):
            raise BenchError(f"cannot resume {config.resume}: {manifest_path} has no "
                             "fingerprint (made by an older version); start a new run")
        if changed := _differences(was, prints):
            raise BenchError(f"cannot resume {config.resume}: this is not the same run: "
                             + "; ".join(changed) + " (start a new run, or resume with the "
                             "run's own settings)")
        return config.resume, run_dir, manifest
    run_id = config.run_id or f"{config.regime}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    run_dir = results / run_id
    if run_dir.exists():
        raise BenchError(f"{run_dir} exists; pass RESUME={run_id} to continue it")
    run_dir.mkdir(parents=True)
    return run_id, run_dir, None


def build_arms(config: BenchConfig, paths: dict[str, Path], compressors: Compressors
               ) -> list[Arm]:
    """Each arm's history and policy; with `rewrite_cache=reuse`, the task's rewrite cache."""
    cache = None
    if config.rewrite_cache == "reuse":
        cache = CompactionCache(histories_root() / config.task / "compaction" / "cache.jsonl")
    from histories.policies.registry import parse_arm

    return [arm_for(arm, load_history(paths[arm]), compressors=compressors.configs, cache=cache,
                    before_request=compressors.hooks.get(parse_arm(arm).compressor or ""))
            for arm in config.arms]


@dataclass
class Compressors:
    """Each compaction arm's compressor, and what runs before its requests (a lazy start)."""

    configs: dict[str, CompressorConfig]
    hooks: dict[str, Callable[[], None]]


@contextmanager
def _compressors(config: BenchConfig, profile: Profile, target_url: str, run_dir: Path,
                 origin: float, phases: PhaseLog) -> Iterator[Compressors]:
    """`self`: the target's own `compressor` name. `external`: EXTERNAL_URL, or on CPU the
    embedded Gemma server on port + 1, started only when a block first needs a rewrite (on
    cpu-tiny none does: every block stays under the identity rule)."""
    if config.prompt not in REWRITE_PROMPTS:
        raise BenchError(f"unknown prompt {config.prompt!r}; use one of "
                         f"{', '.join(REWRITE_PROMPTS)}")
    found = Compressors({"self": _deadline(self_compressor(
        target_url, model=profile.model.compressor_name, prompt=config.prompt), config)}, {})
    from histories.policies.registry import compressors_needed

    if "external" not in compressors_needed(config.arms):  # external, external-every-<n>
        yield found
        return
    if config.external_url is not None:
        with server_for(ServerConfig(profile=profile), config.external_url) as url:
            found.configs["external"] = _deadline(external_compressor(url, prompt=config.prompt),
                                                  config)
            yield found
        return
    if profile.engine != "cpu":
        raise BenchError("the external arm needs another model's endpoint on a GPU profile: "
                         "pass EXTERNAL_URL=<OpenAI-compatible URL> (key in "
                         "$COMPRESSOR_API_KEY), or ARMS=clean,self")
    lazy = LazyServer(ServerConfig(profile=load_profile(EXTERNAL_COMPRESSOR_PROFILE),
                                   port=config.port + 1), name="external-compressor",
                      events=run_dir / "helpers.jsonl", origin=origin)
    try:
        # the embedded Gemma is a base model that rambles: its first draft is capped per word
        found.configs["external"] = _deadline(external_compressor(
            lazy.config.api_url, prompt=config.prompt, max_tokens_per_raw_word=2.0), config)

        def ensure() -> None:
            started = time.monotonic()
            fresh = not lazy.used
            lazy.ensure()
            if fresh and lazy.server is not None:  # started now, not reused
                phases.add("compressor_start", started, time.monotonic())

        found.hooks["external"] = ensure
        yield found
    finally:
        lazy.stop()


def _deadline(compressor: CompressorConfig, config: BenchConfig) -> CompressorConfig:
    """The compressor with the run's stream deadline (COMPRESSOR_DEADLINE)."""
    endpoint = compressor.endpoint.model_copy(
        update={"request_timeout_s": config.compressor_deadline_s})
    return compressor.model_copy(update={"endpoint": endpoint})


def _block_passes(run_dir: Path, regime: str, arms: tuple[str, ...]
                  ) -> tuple[set[int], dict[int, int]]:
    """(blocks done, the pass a block not done runs as). A block is done when its block record
    exists and every arm has its original record of that pass; a block a crash cut short
    (records of some arms, no block record) runs again in full as the next pass, and analysis
    uses only its last pass. So does a block whose load made it invalid (the background died,
    was refused, never queued): a resumed run measures it again under a working load."""
    if not (run_dir / "arms.jsonl").exists():
        return set(), {}
    folder = read_run(run_dir)
    latest: dict[int, BlockRecord] = {}
    for b in folder.blocks:
        if b.regime == regime and (b.block_pass or 1) >= (
                latest[b.block].block_pass or 1 if b.block in latest else 0):
            latest[b.block] = b
    closed = {n: b.block_pass or 1 for n, b in latest.items() if not b.invalid_reasons}
    seen: dict[tuple[int, int], set[str]] = {}
    highest: dict[int, int] = {}
    for r in folder.arms:
        if r.regime == regime and r.attempt == "original":
            seen.setdefault((r.block, r.block_pass or 1), set()).add(r.arm)
            highest[r.block] = max(highest.get(r.block, 0), r.block_pass or 1)
    done = {b for b, p in closed.items() if set(arms) <= seen.get((b, p), set())}
    return done, {b: max(p, latest[b].block_pass or 1 if b in latest else 0) + 1
                  for b, p in highest.items() if b not in done}


def _failed_arms(run_dir: Path, regime: str) -> list[tuple[int, str]]:
    records = read_run(run_dir).arms if (run_dir / "arms.jsonl").exists() else ()
    recovered = {(r.block, r.arm) for r in records if r.attempt == "recovery" and r.complete}
    return sorted({(r.block, r.arm) for r in records
                   if r.regime == regime and r.attempt == "original" and not r.complete}
                  - recovered)


class LoadMonitor:
    """Samples the background load's state twice a second into `load.jsonl` (run clock)."""

    def __init__(self, load: BackgroundLoad, path: Path, origin: float) -> None:
        self.load = load
        self.writer = JsonlWriter(path)
        self.origin = origin
        self.block: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(LOAD_SAMPLE_S):
            status = self.load.status()
            now = time.monotonic()
            self.writer.write({
                "t_s": now - self.origin, "block": self.block, "running": status.running,
                "users": status.users, "started": status.started, "answered": status.answered,
                "in_flight": status.in_flight, "done": status.done, "ok": status.ok,
                "errors": status.errors, "unauthorized": status.unauthorized,
                "last_ok_age_s": now - status.last_ok_t if status.last_ok_t else None})

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.writer.close()


@dataclass
class Telemetry:
    sampler: MetricsSampler
    monitor: LoadMonitor | None  # None: the regime has no background users


@contextmanager
def _telemetry(config: BenchConfig, url: str, run_dir: Path, origin: float, users: int,
               profile: Profile, probe: ServiceProbe | None) -> Iterator[Telemetry]:
    """Server metrics and GPU samplers for the whole run; background users when the regime has
    any, living exactly as long as the run (started before the first block and steady before
    it begins), with a monitor sampling them."""
    from loadgen.background import BackgroundConfig, ReplayOptions
    from loadgen.gpu import GpuSampler

    with ExitStack() as stack:
        sampler = stack.enter_context(MetricsSampler(url, run_dir / "metrics.jsonl",
                                                     origin=origin))
        stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin))
        if not users:
            yield Telemetry(sampler, None)
            return
        # Small models without a reasoning field or tool calls get old reasoning and tool
        # calls inline as text, so background prompts keep realistic lengths. Turns whose
        # history recorded no wall time are paced by the server's measured service time.
        replay = ReplayOptions(
            reasoning="keep" if profile.model.reasoning == "native" else "inline",
            tool_calls="keep" if profile.model.tool_calls else "inline",
            measured_ttft_s=probe.ttft_s if probe else None,
            measured_tokens_per_s=probe.tokens_per_s if probe else None)
        load = stack.enter_context(BackgroundLoad(BackgroundConfig(
            server_url=url, model=profile.model.target_name, users=users,
            regime=config.regime, out=run_dir / "requests.jsonl", origin=origin,
            workers=config.locust_workers, seed=config.seed, replay=replay,
            spawn_rate=max(1.0, users / 10), max_model_len=profile.engine_args.max_model_len,
            state_dir=run_dir / "background", duration_s=None)))
        load.wait_steady(timeout_s=600)
        yield Telemetry(sampler, stack.enter_context(
            LoadMonitor(load, run_dir / "load.jsonl", origin)))


def resumed_config(config: BenchConfig) -> BenchConfig:
    """For RESUME: the config with the run's own settings where the user gave none."""
    if not config.resume:
        return config
    path = Path(config.results_dir) / config.resume / "manifest.json"
    try:
        previous = json.loads(path.read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return config  # open_run says what is wrong with the folder
    return config.resumed(previous) if isinstance(previous, dict) else config


@dataclass
class _Run:
    """What one run of `run_bench` carries between its phases."""

    config: BenchConfig
    profile: Profile
    run_id: str
    run_dir: Path
    manifest: dict[str, Any] | None
    origin: float
    users: int
    total: int
    done: set[int]
    passes: dict[int, int]
    stop: RunStop

    @property
    def hint(self) -> str:
        return f"finished records are in {self.run_dir}; continue with RESUME={self.run_id}"


def run_bench(config: BenchConfig, *, stream: TextIO = sys.stderr) -> RunOutcome:
    config = resumed_config(config)
    if config.regime == SWEEP:  # closed-loop fleets instead of blocks: bench/run/sweep.py
        from bench.run.sweep import run_sweep

        return run_sweep(config, stream=stream)
    profile = resolve_profile(config.profile)
    if config.speculative is not None or config.expert_parallel is not None:
        profile = profile.with_features(speculative=config.speculative,
                                        expert_parallel=config.expert_parallel)
    task = load_task(config.task)
    task.check_runnable()
    sandbox = confinement()  # before anything starts: no unconfined agent unless asked
    paths = history_paths(config.task, config.arms)
    prints = fingerprint(config, profile, paths)
    run_id, run_dir, manifest = open_run(config, prints)
    users = regime_users(config.regime, profile)
    done, passes = _block_passes(run_dir, config.regime, config.arms)
    run = _Run(config=config, profile=profile, run_id=run_id, run_dir=run_dir,
               manifest=manifest, users=users,
               origin=float(manifest["clock_origin_monotonic"]) if manifest else time.monotonic(),
               total=config.blocks or (int(manifest["regime"]["blocks"]) if manifest
                                       else default_blocks(config.regime, profile)),
               done=done, passes=passes, stop=RunStop())
    records: list[ArmRecord] = []
    aborted = None
    # the handlers cover cleanup and the report: a late Ctrl-C cannot leave a server running
    # or a report half-written
    phases = PhaseLog(run_dir, run.origin)
    invoked = time.monotonic()
    with run.stop.signals(stream):
        with ExitStack() as stack:
            with phases.phase("server_start"):
                url = stack.enter_context(server_for(
                    ServerConfig(profile=profile, port=config.port,
                                 fast_start=config.fast_start), config.server_url))
            compressors = stack.enter_context(
                _compressors(config, profile, url, run_dir, run.origin, phases))
            with phases.phase("selfcheck"):
                check = _selfcheck(config, url, profile, run_dir)
            arms = build_arms(config, paths, compressors)
            model = config_for_profile(profile, url, config.seed).model_copy(
                update={"request_timeout_s": config.stream_deadline_s})
            if config.token_ids:  # prompt and completion ids come back: cache-break accounting
                model = model.model_copy(update={"extra_body": {**model.extra_body,
                                                                "return_token_ids": True}})
            with phases.phase("service_probe"):
                probe = _probe(url, profile, users)
            if run.manifest is None:
                run.manifest = build_manifest(
                    config, profile, run_id=run_id, api_url=url,
                    server_version=server_version(url), histories=history_hashes(paths),
                    users=users, blocks=run.total)
                run.manifest.update({
                    "clock_origin_monotonic": run.origin, "fingerprint": prints,
                    "structured_text": model.structured_text,
                    "service_probe": asdict(probe) if probe else None, "selfcheck": check,
                    "sandbox": sandbox.describe()})
                write_json(run_dir / "manifest.json", run.manifest)
            print(f"[bench] run {run_id}: {config.regime}, {users} background users, blocks "
                  f"{len(done)}/{run.total} already done, arms {', '.join(config.arms)}, agent "
                  f"commands confined by {sandbox.level} -> {run_dir}", file=stream, flush=True)
            settings = BlockSettings(
                config=config, run_id=run_id, task=task, model=model,
                protocol=config.protocol_for(profile),
                block_size=profile.engine_args.block_size or DEFAULT_KV_BLOCK,
                ledger=Ledger(run_dir / "ledger.jsonl"),
                # the clock origin is this run's own and the manifest keeps it for RESUME
                run_salt=f"{run_id}-{run.origin:.6f}")
            records, aborted = _blocks(run, arms, settings, url, probe, stream)
        phases.add("invocation", invoked, time.monotonic())  # up to the report's start
        if run.stop.reason is not None:
            aborted = run.stop.reason.message
            if "RESUME=" not in aborted:
                aborted += f"; {run.hint}"
        report = None
        if records or done:
            try:
                report = write_report(run_dir, seed=config.seed)
            except (OSError, SuiteError) as exc:  # a full disk: the records are safe
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                aborted = ((aborted + "; ") if aborted else "") + (
                    f"the report could not be written ({why.splitlines()[0]}); once fixed, "
                    f"`make report RUN={run_id}` writes it from the records")
    code = (run.stop.reason.exit_code if run.stop.reason is not None
            else ExitCode.FAILED if aborted else ExitCode.OK)
    return RunOutcome(run_dir=run_dir, records=records, report=report, aborted=aborted,
                      exit_code=code)


def _blocks(run: _Run, arms: list[Arm], settings: BlockSettings, url: str,
            probe: ServiceProbe | None, stream: TextIO) -> tuple[list[ArmRecord], str | None]:
    """Every block not done yet, under the run's telemetry and watchdog: (records, why the run
    ended early or None). A stop (signal, watchdog, unwritable records) ends it at once."""
    config, stop = run.config, run.stop

    def unwritable(exc: RecordWriteError) -> None:
        stop.stop(f"{exc}".splitlines()[0] + "; free space or fix the folder, then "
                  f"continue with RESUME={run.run_id}")

    writer = RunWriter(run.run_dir, run.origin, on_failure=unwritable)
    stop.on_stop = writer.cancel
    for name in writer.repaired:
        print(f"[bench] {name}: its last line was cut short by a crash; readers skip it and new "
              "records start on a fresh line", file=stream, flush=True)
    progress = Progress(total_blocks=run.total, url=url, stream=stream)
    progress.done = len(run.done)
    records: list[ArmRecord] = []
    aborted = None
    try:
        with _telemetry(config, url, run.run_dir, run.origin, run.users, run.profile,
                        probe) as telemetry, \
                Watchdog(url, config.stall_s, lambda why: _stop_for(stop, f"{why}; {run.hint}"),
                         healthy=is_healthy, sampler=telemetry.sampler):
            monitor = telemetry.monitor
            progress.start()
            for block in [b for b in range(1, run.total + 1) if b not in run.done]:
                if monitor is not None:
                    monitor.load.check()  # alive, authorised and answering, or stop here
                    monitor.load.set_block(block)
                    monitor.block = block
                found, closed = _one_block(arms, settings, block, writer, progress, run.users,
                                           run.passes.get(block, 1), lambda: is_healthy(url))
                records += found
                if not closed:
                    aborted = (f"the server at {url} stopped answering during block {block} "
                               f"(the block is left open: RESUME runs it again in full); "
                               f"{run.hint} after restarting it")
                    break
            if monitor is not None and aborted is None:
                monitor.load.check()  # the last block's load is checked like every other
            if config.recover and aborted is None:
                records += _recover(arms, settings, run.run_dir, writer)
    except BackgroundLoadError as exc:
        aborted = (f"{exc}".splitlines()[0] + f"; the blocks so far are on record in "
                   f"{run.run_dir} (a block whose load failed is marked invalid); continue "
                   f"with RESUME={run.run_id}")
    except KeyboardInterrupt as exc:
        stop.stop(f"interrupted ({exc or 'Ctrl-C'})", ExitCode.INTERRUPTED,
                  interrupt_main=False)  # a KeyboardInterrupt no handler saw: still stop
    finally:
        progress.stop()
        writer.close()
    return records, aborted


def _stop_for(stop: RunStop, message: str) -> None:
    stop.stop(message)


def _selfcheck(config: BenchConfig, url: str, profile: Profile, run_dir: Path
               ) -> dict[str, Any]:
    """The serve-time self-check before any block (serve.selfcheck): its report goes into the
    manifest; a failure stops the run here, its report kept in `selfcheck.json`."""
    if not config.selfcheck:
        return {"skipped": "SELFCHECK=0 / --no-selfcheck: the server was not checked"}
    import os

    from serve.selfcheck import SelfCheckError, run_selfcheck

    try:
        report = run_selfcheck(url, profile, api_key=os.environ.get("API_KEY") or None)
    except SelfCheckError as exc:
        write_json(run_dir / "selfcheck.json", exc.report.to_json())
        raise
    found: dict[str, Any] = report.to_json()
    return found


def _probe(url: str, profile: Profile, users: int) -> ServiceProbe | None:
    """The server's unloaded service time, measured before the background starts (pacing)."""
    if not users:
        return None
    import os

    from loadgen.background import measure_service

    return measure_service(url, profile.model.target_name, api_key=os.environ.get("API_KEY"))


def _one_block(arms: list[Arm], settings: BlockSettings, block: int, writer: RunWriter,
               progress: Progress, users: int, block_pass: int,
               server_ok: Callable[[], bool]) -> tuple[list[ArmRecord], bool]:
    """Run one block; (its arm records, whether it was closed). A block after which the server
    no longer answers gets no block record: its failures are the server's, not the arms', so
    `RESUME` runs it again in full as its next pass (the arm records stay, as pass 1)."""
    config = settings.config
    rng = np.random.default_rng([config.seed, block])
    for arm in arms:
        progress.arm_started(arm.name)
    try:
        outcome = run_block(arms, settings=settings, regime=config.regime, block=block,
                            rng=rng, writer=writer, block_pass=block_pass)
    finally:
        for arm in arms:
            progress.arm_finished(arm.name)
    origin = writer.origin
    started, ended = outcome.started_s - origin, outcome.ended_s - origin
    with contextlib.suppress(OSError):
        writer.sync()
    if not server_ok():
        return outcome.records, False
    folder = read_run(writer.run_dir)
    load = block_load(config.regime, users, started, ended,
                      [r for r in folder.requests if r.regime == config.regime],
                      list(folder.metrics), list(folder.load))
    writer.block(BlockRecord(
        regime=config.regime, block=block, order=outcome.order, started_s=started,
        ended_s=ended, seed=outcome.seed,
        released_s=None if outcome.released_s is None else outcome.released_s - origin,
        load=load.to_json(), invalid_reasons=load.reasons,
        block_pass=block_pass if block_pass > 1 else None))
    writer.sync()
    progress.block_finished(ended - started)
    return outcome.records, True


def _recover(arms: list[Arm], settings: BlockSettings, run_dir: Path,
             writer: RunWriter) -> list[ArmRecord]:
    """Re-run each failed original arm alone, later than its block: a recovery run."""
    by_arm = {a.name: a for a in arms}
    out: list[ArmRecord] = []
    for block, arm in _failed_arms(run_dir, settings.config.regime):
        out += run_block([by_arm[arm]], settings=settings, regime=settings.config.regime,
                         block=block, rng=np.random.default_rng(0), writer=writer,
                         attempt="recovery").records
    return out
