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
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from compaction_bench.bench.analysis.load import run_block_load
from compaction_bench.bench.analysis.paired import helper_waits
from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings, run_block
from compaction_bench.bench.run.config import (
    REFERENCE,
    SEARCH,
    SWEEP,
    BenchConfig,
    regime_users,
)
from compaction_bench.bench.run.hostwatch import HostSampler, span_host
from compaction_bench.bench.run.progress import Progress
from compaction_bench.bench.run.resume import block_passes, failed_arms, resumed_config
from compaction_bench.bench.run.session import (
    Compare,
    Report,
    RunKind,
    RunOutcome,
    Session,
    run_session,
)
from compaction_bench.bench.run.source import SourceKind
from compaction_bench.bench.run.sources import default_blocks
from compaction_bench.bench.run.stop import RunStop
from compaction_bench.bench.run.telemetry import run_telemetry, service_probe
from compaction_bench.bench.run.watchdog import Watchdog
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord, BlockRecord, read_run
from compaction_bench.loadgen.background import BackgroundLoadError, ServiceProbe
from compaction_bench.serve.endpoints import is_healthy
from compaction_bench.serve.profile import Profile


def run_bench(config: BenchConfig, *, stream: TextIO = sys.stderr,
              report: Report | None = None, compare: Compare | None = None) -> RunOutcome:
    """One `make bench`: blocks under a regime, or the load-response sweep (REGIME=sweep);
    `report(run_dir, seed)` writes the report afterwards (the CLI passes it). With
    ROUTER_POLICY=a,b the whole run once per policy, each through a router of its own
    (bench/run/routing.py), and `compare` writes their comparison (the CLI passes it); the
    outcome's `report` is then the `RoutedRuns`."""
    config = resumed_config(config)
    if config.router_policy:
        from compaction_bench.bench.run.routing import routed_outcome, run_policies

        runs = run_policies(config, lambda routed, wrap: _run_kind(
            routed, wrap, stream=stream, report=report), compare=compare, stream=stream)
        return routed_outcome(runs, Path(config.results_dir))
    return _run_kind(config, lambda kind: kind, stream=stream, report=report)


def _run_kind(config: BenchConfig, wrap: Callable[[RunKind], RunKind], *, stream: TextIO,
              report: Report | None) -> RunOutcome:
    if config.regime == SWEEP:  # closed-loop fleets instead of blocks: bench/run/sweep.py
        from compaction_bench.bench.run.sweep import Sweep

        return run_session(config, wrap(Sweep()), stream=stream)  # its document is `make plan`
    if config.regime == SEARCH:  # capacity in one run: bench/run/search.py
        from compaction_bench.bench.run.search import Search

        return run_session(config, wrap(Search()), stream=stream)
    return run_session(config, wrap(Blocks()), stream=stream, report=report)


class Blocks:
    """The kind of run that runs blocks of arms under a regime (the session does the rest)."""

    name = "blocks"

    def __init__(self) -> None:
        self.users = 0
        self.total = 0
        self.done: set[int] = set()
        self.passes: dict[int, int] = {}
        self.probe: ServiceProbe | None = None

    def adjust(self, config: BenchConfig, profile: Profile, source: SourceKind) -> BenchConfig:
        return config

    def prints(self, config: BenchConfig, profile: Profile) -> dict[str, Any]:
        return {}

    def prepare(self, session: Session) -> dict[str, Any]:
        config, profile, manifest = session.config, session.profile, session.manifest
        self.users = regime_users(config.regime, profile)
        self.done, self.passes = block_passes(session.run_dir, config.regime, config.arms)
        # every block of every REPEAT run (the manifest's figure already counts them)
        self.total = config.blocks * config.repeat if config.blocks else (
            int(manifest["regime"]["blocks"]) if manifest
            else default_blocks(config.regime, profile, config.source) * config.repeat)
        with session.phases.phase("service_probe"):
            self.probe = service_probe(session.url, profile, self.users)
        return {"users": self.users, "blocks": self.total, "repeat": config.repeat,
                "service_probe": asdict(self.probe) if self.probe else None}

    def run(self, session: Session) -> tuple[list[ArmRecord], str | None]:
        config = session.config
        session.say(f"[bench] run {session.run_id}: {config.regime}, {self.users} background "
                    f"users, blocks {len(self.done)}/{self.total} already done, arms "
                    f"{', '.join(config.arms)}, {session.kind.banner(config)}, agent commands "
                    f"confined by {session.confinement} -> "
                    f"{session.run_dir}")
        return _blocks(self, session)


def _blocks(run: Blocks, session: Session) -> tuple[list[ArmRecord], str | None]:
    """Every block not done yet, under the run's telemetry and watchdog: (records, why the run
    ended early or None). A stop (signal, watchdog, unwritable records) ends it at once."""
    config, stop, url, arms = session.config, session.stop, session.url, session.arms
    settings = session.settings
    assert settings is not None
    writer = session.writer()
    for name in writer.repaired:
        session.say(f"[bench] {name}: its last line was cut short by a crash; readers skip it "
                    "and new records start on a fresh line")
    progress = Progress(total_blocks=run.total, url=url, stream=session.stream)
    progress.done = len(run.done)
    records: list[ArmRecord] = []
    aborted = None
    try:
        with run_telemetry(config, url, session.run_dir, session.origin, run.users,
                           session.profile, run.probe) as telemetry, \
                Watchdog(url, config.stall_s,
                         lambda why: _stop_for(stop, f"{why}; {session.hint}"),
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
                                                  run.users, block_pass, lambda: is_healthy(url),
                                                  host=telemetry.host)
                if closed and waits:  # the compressor is up now: the block again, fairly
                    session.say(f"[bench] block {block}: {waits[0]}; it runs again as pass "
                                f"{block_pass + 1} (the first pass stays on record, invalid)")
                    records += found
                    found, closed, _ = _one_block(arms, settings, block, writer, progress,
                                                  run.users, block_pass + 1,
                                                  lambda: is_healthy(url), host=telemetry.host)
                records += found
                if not closed:
                    aborted = (f"the server at {url} stopped answering during block {block} "
                               f"(the block is left open: RESUME runs it again in full); "
                               f"{session.hint} after restarting it")
                    break
            if monitor is not None and aborted is None:
                monitor.load.check()  # the last block's load is checked like every other
            if config.recover and aborted is None:
                records += _recover(arms, settings, session.run_dir, writer)
    except BackgroundLoadError as exc:
        aborted = (f"{exc}".splitlines()[0] + f"; the blocks so far are on record in "
                   f"{session.run_dir} (a block whose load failed is marked invalid); continue "
                   f"with RESUME={session.run_id}")
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
               server_ok: Callable[[], bool], host: HostSampler | None = None
               ) -> tuple[list[ArmRecord], bool, list[str]]:
    """Run one block; (its arm records, whether it was closed, the arms that waited for a
    compressor server's lazy start). A block after which the server no longer answers gets no
    block record: its failures are the server's, not the arms', so `RESUME` runs it again in
    full as its next pass (the arm records stay, as pass 1)."""
    config = settings.config
    rng = np.random.default_rng([config.seed, config.position(block)])  # REPEAT: as run 1's
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
    load = run_block_load(folder, config.regime, users, started, ended,
                          arms_from=None if outcome.released_s is None
                          else outcome.released_s - origin)
    waits = helper_waits(outcome.records)  # not a fair block: it runs again as its next pass
    reasons = (*load.reasons, *waits)
    writer.block(BlockRecord(
        regime=config.regime, block=block, order=outcome.order, started_s=started,
        ended_s=ended, seed=outcome.seed,
        released_s=None if outcome.released_s is None else outcome.released_s - origin,
        load=load.to_json(), invalid_reasons=reasons,
        block_pass=block_pass if block_pass > 1 else None, record=outcome.record,
        # the host while the arms ran (bench/analysis/host.py; analysis recomputes it)
        host=span_host(host, writer.run_dir, started if outcome.released_s is None
                       else outcome.released_s - origin, ended)))
    writer.sync()
    progress.block_finished(ended - started)
    return outcome.records, True, waits


def _recover(arms: list[Arm], settings: BlockSettings, run_dir: Path,
             writer: RunWriter) -> list[ArmRecord]:
    """Re-run each failed original arm alone, later than its block: a recovery run. Its
    invariant is checked against clean's history, not the arm's own."""
    by_arm = {a.name: a for a in arms}
    out: list[ArmRecord] = []
    for block, arm in failed_arms(run_dir, settings.config.regime):
        out += run_block([by_arm[arm]], settings=settings, regime=settings.config.regime,
                         block=block, rng=np.random.default_rng(0), writer=writer,
                         attempt="recovery", reference=by_arm.get(REFERENCE)).records
    return out
