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
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from compaction_bench.bench.analysis.load import block_load
from compaction_bench.bench.analysis.paired import helper_waits
from compaction_bench.bench.analysis.runfolder import (
    ArmRecord,
    BlockRecord,
    read_run,
    write_json,
)
from compaction_bench.bench.report.run_report import ReportFiles, write_report
from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings, run_block
from compaction_bench.bench.run.compressors import build_arms, open_compressors
from compaction_bench.bench.run.config import (
    SWEEP,
    BenchConfig,
    default_blocks,
    regime_users,
)
from compaction_bench.bench.run.manifest import build_manifest, history_hashes
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.progress import Progress
from compaction_bench.bench.run.resume import (
    block_passes,
    failed_arms,
    fingerprint,
    history_paths,
    open_run,
    resumed_config,
)
from compaction_bench.bench.run.stop import RunStop
from compaction_bench.bench.run.telemetry import run_telemetry, selfcheck, service_probe
from compaction_bench.bench.run.watchdog import Watchdog
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.files import RecordWriteError
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.agent.sandbox import confinement
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.loadgen.background import BackgroundLoadError, ServiceProbe
from compaction_bench.serve.launcher import ServerConfig, is_healthy, server_for, server_version
from compaction_bench.serve.profile import Profile, resolve_profile

LOAD_SAMPLE_S = 0.5  # how often the monitor samples the background load's state
DEFAULT_KV_BLOCK = 16  # vLLM's KV block size where a profile sets none


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    records: list[ArmRecord]
    report: ReportFiles | None
    aborted: str | None
    exit_code: ExitCode = ExitCode.OK  # FAILED, or INTERRUPTED for a signal


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
        from compaction_bench.bench.run.sweep import run_sweep

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
    done, passes = block_passes(run_dir, config.regime, config.arms)
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
                open_compressors(config, profile, url, run_dir, run.origin, phases))
            with phases.phase("selfcheck"):
                check = selfcheck(config, url, profile, run_dir)
            arms = build_arms(config, paths, compressors)
            model = config_for_profile(profile, url, config.seed).model_copy(
                update={"request_timeout_s": config.stream_deadline_s})
            if config.token_ids:  # prompt and completion ids come back: cache-break accounting
                model = model.model_copy(update={"extra_body": {**model.extra_body,
                                                                "return_token_ids": True}})
            with phases.phase("service_probe"):
                probe = service_probe(url, profile, users)
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
        with run_telemetry(config, url, run.run_dir, run.origin, run.users, run.profile,
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
                block_pass = run.passes.get(block, 1)
                found, closed, waits = _one_block(arms, settings, block, writer, progress,
                                                  run.users, block_pass, lambda: is_healthy(url))
                if closed and waits:  # the compressor is up now: the block again, fairly
                    print(f"[bench] block {block}: {waits[0]}; it runs again as pass "
                          f"{block_pass + 1} (the first pass stays on record, invalid)",
                          file=stream, flush=True)
                    records += found
                    found, closed, _ = _one_block(arms, settings, block, writer, progress,
                                                  run.users, block_pass + 1,
                                                  lambda: is_healthy(url))
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
        stop.interrupted(exc)
    finally:
        progress.stop()
        writer.close()
    return records, aborted


def _stop_for(stop: RunStop, message: str) -> None:
    stop.stop(message)


def _one_block(arms: list[Arm], settings: BlockSettings, block: int, writer: RunWriter,
               progress: Progress, users: int, block_pass: int,
               server_ok: Callable[[], bool]) -> tuple[list[ArmRecord], bool, list[str]]:
    """Run one block; (its arm records, whether it was closed, the arms that waited for a
    compressor server's lazy start). A block after which the server no longer answers gets no
    block record: its failures are the server's, not the arms', so `RESUME` runs it again in
    full as its next pass (the arm records stay, as pass 1)."""
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
        return outcome.records, False, []
    folder = read_run(writer.run_dir)
    load = block_load(config.regime, users, started, ended,
                      [r for r in folder.requests if r.regime == config.regime],
                      list(folder.metrics), list(folder.load))
    waits = helper_waits(outcome.records)  # not a fair block: it runs again as its next pass
    reasons = (*load.reasons, *waits)
    writer.block(BlockRecord(
        regime=config.regime, block=block, order=outcome.order, started_s=started,
        ended_s=ended, seed=outcome.seed,
        released_s=None if outcome.released_s is None else outcome.released_s - origin,
        load=load.to_json(), invalid_reasons=reasons,
        block_pass=block_pass if block_pass > 1 else None))
    writer.sync()
    progress.block_finished(ended - started)
    return outcome.records, True, waits


def _recover(arms: list[Arm], settings: BlockSettings, run_dir: Path,
             writer: RunWriter) -> list[ArmRecord]:
    """Re-run each failed original arm alone, later than its block: a recovery run."""
    by_arm = {a.name: a for a in arms}
    out: list[ArmRecord] = []
    for block, arm in failed_arms(run_dir, settings.config.regime):
        out += run_block([by_arm[arm]], settings=settings, regime=settings.config.regime,
                         block=block, rng=np.random.default_rng(0), writer=writer,
                         attempt="recovery").records
    return out
