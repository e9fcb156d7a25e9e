"""`make bench REGIME=sweep`: the load-response sweep the capacity plan is fitted to.

For each level N and each arm on its own (a *cell*), a homogeneous closed-loop fleet of N agents
continues the arm's history from the fork again and again: each agent runs one continuation
after another through the same machinery as a block (`bench.run.block.run_block` with that one
arm: setup, the reasoning-only invariant on the wire, the arm's real policy and tools, one
`ArmRecord`), each continuation with a fresh sampling seed. A fleet that compacts asks the server
for less, and the curve sees it, because every agent of a cell runs the same arm.

Which continuations a cell measures, so that every measured one ran with all N agents active:
1. each agent's first `warmup` continuations are `warmup` (all agents start together, on a
   cold cache for that arm's history); recorded and flagged, never planned;
2. then each agent runs `ceil(min_continuations / N)` `measured` continuations, and keeps
   starting measured ones while the cell has run less than `level_s` seconds. All of an agent's
   measured continuations are kept whatever their length, so a long one is never dropped for
   running past a deadline (no length-biased selection);
3. an agent whose measured share is done while others are still measuring runs `drain`
   continuations, so the load stays at N until the last measured one ends; they are recorded
   and flagged, never planned. The cell ends when every agent has stopped.

Seeds: continuation k of agent i at level N has block number `continuation_block(N, i, k)`, and
its sampling seed derives from the run seed and that number (`bench.run.config.arm_seed`); with
the default common seeds, the same (N, i, k) of two arms share a seed, which pairs them for the
break-even analysis. Levels run in ascending order; within a level the arms run in a seeded
random order, so slow drift of the machine does not line up with one arm. There is no
background load: the fleet is the load.

Records: the run folder's usual files (arm records carry `level`, `sweep_agent`, `sweep_index`,
`sweep_phase`; request records the same as labels), one block record per continuation,
`metrics.jsonl` and `gpu.jsonl` for the whole run, and `sweep.jsonl`: one line per finished
cell (plan/SCHEMA.md). `RESUME=<run-id>` skips the cells that have their line and runs any cell a
crash cut short again, as its next pass (`block_pass`); the plan reads only a cell's last pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from compaction_bench.bench.analysis.host import CONTENDED
from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings
from compaction_bench.bench.run.config import REFERENCE, SWEEP, BenchConfig
from compaction_bench.bench.run.fleet import CellOutcome, run_cell
from compaction_bench.bench.run.hostwatch import HostSampler, span_host
from compaction_bench.bench.run.session import Session
from compaction_bench.bench.run.source import SourceKind
from compaction_bench.bench.run.stop import RunStop
from compaction_bench.bench.run.telemetry import run_telemetry
from compaction_bench.bench.run.watchdog import Watchdog
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord
from compaction_bench.common.files import JsonlWriter, read_jsonl
from compaction_bench.serve.endpoints import ServerEndpoints, is_healthy
from compaction_bench.serve.profile import Profile

SWEEP_FILE = "sweep.jsonl"


def finished_cells(run_dir: Path, *, remeasure_contended: bool = False
                   ) -> tuple[set[tuple[str, int]], dict[tuple[str, int], int]]:
    """(cells done, the pass each started-but-unfinished cell runs as next). With
    `remeasure_contended` (QUIET_ONLY=1 on a RESUME), a cell whose last pass ran on a contended
    host is not done: it runs again as its next pass, which the plan then reads (its last)."""
    done: set[tuple[str, int]] = set()
    passes: dict[tuple[str, int], int] = {}
    path = run_dir / SWEEP_FILE
    if path.is_file():
        for obj in read_jsonl(path).objects:
            if obj.get("status") == "done":
                key = (str(obj.get("arm")), int(obj.get("level") or 0))
                host = obj.get("host")
                if remeasure_contended and isinstance(host, dict) and host.get(
                        "verdict") == CONTENDED:
                    done.discard(key)
                    passes[key] = int(obj.get("cell_pass") or 1) + 1
                else:
                    done.add(key)
                    passes.pop(key, None)
    arms_path = run_dir / "arms.jsonl"
    if arms_path.is_file():
        for obj in read_jsonl(arms_path).objects:
            if obj.get("regime") == SWEEP and isinstance(obj.get("level"), int):
                key = (str(obj.get("arm")), int(obj["level"]))
                if key not in done:
                    passes[key] = max(passes.get(key, 1), int(obj.get("block_pass") or 1) + 1)
    return done, passes


def server_cache_config(url: str) -> dict[str, str]:
    """The engine's cache arguments from `/metrics` (`vllm:cache_config_info`: KV blocks,
    block size), for the plan's KV-cache cap; {} where the server exports none."""
    with ServerEndpoints(url, timeout_s=10.0) as server:
        return server.cache_config()


def sweep_config(config: BenchConfig, engine: str, source: SourceKind) -> BenchConfig:
    """The config a sweep runs with. On a CPU the embedded model cannot reason, so the sweep
    only shows the machinery: the source's CPU defaults (its arms, a live agent's short step
    limit; bench/run/source.py `cpu_sweep`) keep `make bench REGIME=sweep` to minutes, unless
    given (STEP_LIMIT=, ARMS=). GPU profiles keep the task's step limit and the run's arms."""
    if engine != "cpu":
        return config
    update = {k: v for k, v in source.cpu_sweep if getattr(config, k) in (None, ())}
    return config.model_copy(update=update) if update else config


class Sweep:
    """The kind of run that measures every (arm, level) cell not done yet (module docstring);
    it stops as a block run does (bench/run/stop.py): a signal, the watchdog or unwritable
    records end it at once, the cut cell without its `sweep.jsonl` line, so `RESUME` runs it
    again as its next pass."""

    name = "sweep"

    def __init__(self) -> None:
        self.levels: tuple[int, ...] = ()
        self.done: set[tuple[str, int]] = set()
        self.passes: dict[tuple[str, int], int] = {}

    def adjust(self, config: BenchConfig, profile: Profile, source: SourceKind) -> BenchConfig:
        self.levels = config.sweep.levels_for(profile.engine_args.max_num_seqs)
        return sweep_config(config, profile.engine, source)

    def prints(self, config: BenchConfig, profile: Profile) -> dict[str, Any]:
        return {"sweep": {**config.sweep.model_dump(mode="json"), "levels": list(self.levels)}}

    def prepare(self, session: Session) -> dict[str, Any]:
        config = session.config
        self.done, self.passes = finished_cells(session.run_dir,
                                                remeasure_contended=session.config.quiet_only)
        return {"users": 0, "blocks": len(self.levels) * len(config.arms),
                "sweep": {"levels": list(self.levels), "arms": list(config.arms),
                          "step_limit": config.step_limit,
                          "settings": config.sweep.model_dump(mode="json"),
                          "server_cache_config": server_cache_config(session.url)}}

    def run(self, session: Session) -> tuple[list[ArmRecord], str | None]:
        config, stop = session.config, session.stop
        cells = [(level, arm) for level in self.levels for arm in config.arms]
        todo = [(n, a) for n, a in cells if (a, n) not in self.done]
        session.say(f"[sweep] run {session.run_id}: levels {', '.join(map(str, self.levels))}, "
                    f"arms {', '.join(config.arms)}, {len(cells) - len(todo)}/{len(cells)} "
                    f"cells already done, step limit "
                    f"{config.step_limit or _step_limit(session)}"
                    f", agent commands confined by {session.confinement} -> {session.run_dir}")
        writer = session.writer()
        cells_out = JsonlWriter(session.run_dir / SWEEP_FILE)
        records: list[ArmRecord] = []
        aborted = None
        assert session.settings is not None
        try:
            with fleet_watch(session, stop) as host:
                records, aborted = _cells(
                    self.levels, config, {a.name: a for a in session.arms}, self.done,
                    self.passes, session.settings, writer, cells_out, stop, session.url,
                    session.hint, session, host)
        except KeyboardInterrupt as exc:
            stop.interrupted(exc)
        finally:
            cells_out.close()
            writer.close()
        if aborted is None and not stop.stopped:
            session.say(f"[sweep] done: make plan RUN={session.run_id}")
        return records, aborted


def _step_limit(session: Session) -> str:
    return str(session.task.spec.step_limit) if session.task else "recorded turns"


@contextmanager
def fleet_watch(session: Session, stop: RunStop) -> Iterator[HostSampler | None]:
    """What runs around a fleet's cells (the sweep's and the search's): the server's /metrics,
    each replica's behind a router, NVML, the host's CPU (no background users: the fleet is the
    load), and the watchdog that stops the run when the server no longer streams; yields the
    host sampler, whose verdict each cell's line carries."""
    def stalled(why: str) -> None:
        stop.stop(f"{why}; {session.hint}")

    with run_telemetry(session.config, session.url, session.run_dir, session.origin, 0,
                       session.profile, None) as telemetry, \
            Watchdog(session.url, session.config.stall_s, stalled, healthy=is_healthy,
                     sampler=telemetry.sampler):
        yield telemetry.host


def _cells(levels: tuple[int, ...], config: BenchConfig, arms: dict[str, Arm],
           done: set[tuple[str, int]], passes: dict[tuple[str, int], int],
           settings: BlockSettings, writer: RunWriter, cells_out: JsonlWriter, stop: RunStop,
           url: str, hint: str, session: Session, host: HostSampler | None = None
           ) -> tuple[list[ArmRecord], str | None]:
    """Every cell not done yet, levels ascending, arms in a seeded order per level: (records,
    why the sweep ended early or None)."""
    records: list[ArmRecord] = []
    for level in levels:
        rng = np.random.default_rng([config.seed, level])
        for name in [config.arms[i] for i in rng.permutation(len(config.arms))]:
            if (name, level) in done:
                continue
            outcome = run_cell(arms[name], level, settings=settings, sweep=config.sweep,
                               writer=writer, cell_pass=passes.get((name, level), 1),
                               stopped=lambda: stop.stopped, reference=arms.get(REFERENCE))
            if stop.stopped:  # the cut cell gets no line: RESUME runs it again
                return records + outcome.records, None
            writer.sync()
            records += outcome.records
            with_host(outcome.line, host, session.run_dir)
            cells_out.write(outcome.line)
            session.say(_cell_line(outcome))
            if not is_healthy(url):
                return records, (f"the server at {url} stopped answering during {name} "
                                 f"N={level}; {hint} after restarting it")
    return records, None


def _cell_line(outcome: CellOutcome) -> str:
    line = outcome.line
    counts = line["continuations"]
    measured = sorted(r.postfork_s for r in outcome.records
                      if r.sweep_phase == "measured" and r.complete)
    median = f"{float(np.median(measured)):.1f} s" if measured else "-"
    host = line.get("host") or {}
    return (f"[sweep] {line['arm']} N={line['level']}: {counts['measured']} measured "
            f"(+{counts['warmup']} warm-up, {counts['drain']} drain, "
            f"{line['measured_failed']} failed) in {line['ended_s'] - line['started_s']:.0f} s;"
            f" median postfork {median}"
            + (f"; host contended: {host.get('figure')}" if host.get("verdict") == CONTENDED
               else ""))


def with_host(line: dict[str, Any], host: HostSampler | None, run_dir: Path) -> None:
    """Add the host's verdict over the cell's span to its `sweep.jsonl` line (`host`: quiet,
    contended with the figure, or unknown; bench/analysis/host.py), for `make plan` to name."""
    line["host"] = span_host(host, run_dir, float(line["started_s"]), float(line["ended_s"]))
