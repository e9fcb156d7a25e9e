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

import dataclasses
import math
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

from bench.analysis.runfolder import ArmRecord, BlockRecord, write_json
from bench.run.arm import Arm
from bench.run.block import BlockSettings, run_block
from bench.run.config import SWEEP, BenchConfig, SweepSettings
from bench.run.manifest import build_manifest, history_hashes

# The run-level steps a sweep shares with a block run: the compressors, the self-check and the
# signal handling (private to the runner; see the report of issue 12 for making them public).
from bench.run.runner import (
    DEFAULT_KV_BLOCK,
    RunOutcome,
    _compressors,
    _selfcheck,
    _signals,
    build_arms,
    fingerprint,
    history_paths,
    open_run,
    resumed_config,
)
from bench.run.writer import RunWriter
from common.files import JsonlWriter, read_jsonl
from common.net import server_url
from common.timing import Clock, monotonic
from histories.agent.chat import config_for_profile
from histories.compaction.ledger import Ledger
from histories.tasks.task import load_task
from loadgen.client import RequestRecord
from serve.engineinfo import cache_config
from serve.launcher import ServerConfig, is_healthy, server_for, server_version
from serve.profile import resolve_profile

SWEEP_FILE = "sweep.jsonl"
# On a CPU the embedded model cannot reason, so the sweep only shows the machinery: two model
# calls per continuation and the two arms on the one server keep `make bench REGIME=sweep`
# (levels 1..8) to minutes (with the task's step limit and three arms it took 20 min on 2
# cores). GPU profiles keep the task's step limit and the run's arms.
CPU_STEP_LIMIT = 2
CPU_ARMS = ("clean", "self")
PHASES = ("warmup", "measured", "drain")


def continuation_block(level: int, agent: int, index: int) -> int:
    """The block number of continuation `index` of `agent` at `level` (unique in a run; the
    same for every arm, so arms share sampling seeds per (level, agent, index))."""
    if not (0 <= agent < 10_000 and 0 <= index < 9_999):
        raise ValueError(f"agent {agent} / continuation {index} out of range for a block number")
    return (level * 10_000 + agent) * 10_000 + index + 1


class _ContinuationWriter(RunWriter):
    """The run's writer as one continuation of a cell sees it: its arm record gets the sweep
    fields, its requests (and its compressor's) the same as labels."""

    def __init__(self, shared: RunWriter, fields: dict[str, Any]) -> None:
        # shares the run's open files: no writers of its own
        self.run_dir = shared.run_dir
        self.origin = shared.origin
        self.shared = shared
        self.fields = fields

    def request(self, record: RequestRecord, **identity: Any) -> None:
        self.shared.request(record, **identity, **self.fields)

    def arm(self, record: Any) -> None:
        self.shared.arm(dataclasses.replace(record, **self.fields))

    def block(self, record: Any) -> None:
        self.shared.block(record)

    def sync(self) -> None:
        self.shared.sync()

    def close(self) -> None:  # the run closes the shared files
        pass


@dataclass
class Fleet:
    """Which phase each agent's next continuation has (module docstring, steps 1-3)."""

    agents: int
    quota: int
    warmup: int
    level_s: float
    started_s: float
    clock: Clock
    begun: list[int] = field(default_factory=list)
    measured: list[int] = field(default_factory=list)
    measuring: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.begun = [0] * self.agents
        self.measured = [0] * self.agents
        self.measuring = [True] * self.agents

    def next_phase(self, agent: int) -> str | None:
        """The phase of `agent`'s next continuation, or None when it should stop. Called when
        the agent has nothing in flight."""
        with self.lock:
            self.begun[agent] += 1
            if self.begun[agent] <= self.warmup:
                return "warmup"
            if self.measured[agent] < self.quota or (
                    self.clock() - self.started_s < self.level_s):
                self.measured[agent] += 1
                return "measured"
            self.measuring[agent] = False
            if any(self.measuring):
                return "drain"
            return None


@dataclass(frozen=True)
class CellOutcome:
    """One finished (arm, level) cell: its records and the `sweep.jsonl` line."""

    records: list[ArmRecord]
    line: dict[str, Any]


def run_cell(arm: Arm, level: int, *, settings: BlockSettings, sweep: SweepSettings,
             writer: RunWriter, cell_pass: int = 1, stop: threading.Event | None = None,
             clock: Clock = monotonic) -> CellOutcome:
    """Run one cell: `level` agents of `arm` in a closed loop (module docstring)."""
    stop = stop or threading.Event()
    started = clock()
    fleet = Fleet(agents=level, quota=max(1, math.ceil(sweep.min_continuations / level)),
                   warmup=sweep.warmup, level_s=sweep.level_s, started_s=started, clock=clock)
    records: list[ArmRecord] = []
    lock = threading.Lock()
    seed = settings.config.seed

    def agent(i: int) -> None:
        index = 0
        while not stop.is_set():
            phase = fleet.next_phase(i)
            if phase is None:
                return
            block = continuation_block(level, i, index)
            view = _ContinuationWriter(writer, {"level": level, "sweep_agent": i,
                                                "sweep_index": index, "sweep_phase": phase})
            outcome = run_block([arm], settings=settings, regime=SWEEP, block=block,
                                rng=np.random.default_rng([seed, block]), writer=view,
                                block_pass=cell_pass, clock=clock)
            origin = writer.origin
            writer.block(BlockRecord(
                regime=SWEEP, block=block, order=outcome.order,
                started_s=outcome.started_s - origin, ended_s=outcome.ended_s - origin,
                seed=outcome.seed, released_s=None if outcome.released_s is None
                else outcome.released_s - origin,
                load={"level": level, "arm": arm.name, "sweep_agent": i, "sweep_index": index,
                      "sweep_phase": phase}, block_pass=cell_pass if cell_pass > 1 else None))
            with lock:
                records.extend(dataclasses.replace(r, level=level, sweep_agent=i,
                                                   sweep_index=index, sweep_phase=phase)
                               for r in outcome.records)
            index += 1

    threads = [threading.Thread(target=agent, args=(i,), name=f"sweep-{arm.name}-{level}-{i}",
                                daemon=True) for i in range(level)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():  # short joins: Ctrl-C reaches the main thread
            thread.join(0.5)
    ended = clock()
    counts = {p: sum(r.sweep_phase == p for r in records) for p in PHASES}
    measured = [r for r in records if r.sweep_phase == "measured"]
    origin = writer.origin
    line = {"arm": arm.name, "level": level, "agents": level, "cell_pass": cell_pass,
            "status": "interrupted" if stop.is_set() else "done",
            "started_s": started - origin, "ended_s": ended - origin,
            "quota_per_agent": fleet.quota, "warmup_per_agent": sweep.warmup,
            "level_s": sweep.level_s, "continuations": counts,
            "measured_failed": sum(not r.complete for r in measured),
            "measured_window_s": [min((r.started_s for r in measured
                                       if r.started_s is not None), default=None),
                                  max((r.ended_s for r in measured
                                       if r.ended_s is not None), default=None)]}
    return CellOutcome(records=records, line=line)


def finished_cells(run_dir: Path) -> tuple[set[tuple[str, int]], dict[tuple[str, int], int]]:
    """(cells done, the pass each started-but-unfinished cell runs as next)."""
    done: set[tuple[str, int]] = set()
    passes: dict[tuple[str, int], int] = {}
    path = run_dir / SWEEP_FILE
    if path.is_file():
        for obj in read_jsonl(path).objects:
            if obj.get("status") == "done":
                done.add((str(obj.get("arm")), int(obj.get("level") or 0)))
    arms_path = run_dir / "arms.jsonl"
    if arms_path.is_file():
        for obj in read_jsonl(arms_path).objects:
            if obj.get("regime") == SWEEP and isinstance(obj.get("level"), int):
                key = (str(obj.get("arm")), int(obj["level"]))
                if key not in done:
                    passes[key] = max(passes.get(key, 1), int(obj.get("block_pass") or 1) + 1)
    return done, passes


def _server_cache_config(url: str) -> dict[str, str]:
    """The engine's cache arguments from `/metrics` (`vllm:cache_config_info`: KV blocks,
    block size), for the plan's KV-cache cap; {} where the server exports none."""
    try:
        return cache_config(httpx.get(f"{server_url(url)}/metrics", timeout=10).text)
    except httpx.HTTPError:
        return {}


def sweep_config(config: BenchConfig, engine: str) -> BenchConfig:
    """The config a sweep runs with: on a CPU a short step limit and the arms on the one
    server, unless they were given (STEP_LIMIT=, ARMS=)."""
    if engine != "cpu":
        return config
    update: dict[str, Any] = {}
    if config.step_limit is None:
        update["step_limit"] = CPU_STEP_LIMIT
    if "arms" not in config.model_fields_set:
        update["arms"] = CPU_ARMS
    return config.model_copy(update=update) if update else config


def run_sweep(config: BenchConfig, *, stream: TextIO = sys.stderr) -> RunOutcome:
    """Run every (arm, level) cell not done yet; see the module docstring."""
    from loadgen.gpu import GpuSampler
    from loadgen.metrics import MetricsSampler

    config = resumed_config(config)
    profile = resolve_profile(config.profile)
    if config.speculative is not None or config.expert_parallel is not None:
        profile = profile.with_features(speculative=config.speculative,
                                        expert_parallel=config.expert_parallel)
    config = sweep_config(config, profile.engine)
    task = load_task(config.task)
    task.check_runnable()
    paths = history_paths(config.task, config.arms)
    levels = config.sweep.levels_for(profile.engine_args.max_num_seqs)
    prints = {**fingerprint(config, profile, paths),
              "sweep": {**config.sweep.model_dump(mode="json"), "levels": list(levels)}}
    run_id, run_dir, manifest = open_run(config, prints)
    done, passes = finished_cells(run_dir)
    cells = [(level, arm) for level in levels for arm in config.arms]
    origin = float(manifest["clock_origin_monotonic"]) if manifest else time.monotonic()
    records: list[ArmRecord] = []
    aborted = None
    stop = threading.Event()
    with _signals(), server_for(ServerConfig(profile=profile, port=config.port),
                                config.server_url) as url, \
            _compressors(config, profile, url, run_dir, origin) as compressors:
        check = _selfcheck(config, url, profile, run_dir)
        arms = {a.name: a for a in build_arms(config, paths, compressors)}
        model = config_for_profile(profile, url, config.seed)
        if manifest is None:
            manifest = build_manifest(config, profile, run_id=run_id, api_url=url,
                                      server_version=server_version(url),
                                      histories=history_hashes(paths), users=0,
                                      blocks=len(cells))
            manifest.update({"clock_origin_monotonic": origin, "fingerprint": prints,
                             "structured_text": model.structured_text, "selfcheck": check,
                             "sweep": {"levels": list(levels), "arms": list(config.arms),
                                       "step_limit": config.step_limit,
                                       "settings": config.sweep.model_dump(mode="json"),
                                       "server_cache_config": _server_cache_config(url)}})
            write_json(run_dir / "manifest.json", manifest)
        todo = [(n, a) for n, a in cells if (a, n) not in done]
        print(f"[sweep] run {run_id}: levels {', '.join(map(str, levels))}, arms "
              f"{', '.join(config.arms)}, {len(cells) - len(todo)}/{len(cells)} cells already "
              f"done, step limit {config.step_limit or task.spec.step_limit} -> {run_dir}",
              file=stream, flush=True)
        writer = RunWriter(run_dir, origin)
        settings = BlockSettings(
            config=config, run_id=run_id, task=task, model=model,
            protocol=config.protocol_for(profile),
            block_size=profile.engine_args.block_size or DEFAULT_KV_BLOCK,
            ledger=Ledger(run_dir / "ledger.jsonl"))
        cells_out = JsonlWriter(run_dir / SWEEP_FILE)
        try:
            with ExitStack() as stack:
                stack.enter_context(MetricsSampler(url, run_dir / "metrics.jsonl",
                                                   origin=origin))
                stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin))
                for level in levels:
                    rng = np.random.default_rng([config.seed, level])
                    order = [config.arms[i] for i in rng.permutation(len(config.arms))]
                    for name in order:
                        if (name, level) in done:
                            continue
                        outcome = run_cell(arms[name], level, settings=settings,
                                           sweep=config.sweep, writer=writer,
                                           cell_pass=passes.get((name, level), 1), stop=stop)
                        writer.sync()
                        records += outcome.records
                        if outcome.line["status"] == "done":
                            cells_out.write(outcome.line)
                        print(_cell_line(outcome), file=stream, flush=True)
                        if not is_healthy(url):
                            aborted = (f"the server at {url} stopped answering during {name} "
                                       f"N={level}; finished cells are in {run_dir}; after "
                                       f"restarting it, continue with RESUME={run_id}")
                            break
                    if aborted:
                        break
        except KeyboardInterrupt as exc:
            stop.set()
            aborted = (f"interrupted ({exc or 'Ctrl-C'}); finished cells are in {run_dir}; "
                       f"continue with RESUME={run_id}")
        finally:
            cells_out.close()
            writer.close()
    if aborted is None:
        print(f"[sweep] done: make plan RUN={run_id}", file=stream, flush=True)
    return RunOutcome(run_dir=run_dir, records=records, report=None, aborted=aborted)


def _cell_line(outcome: CellOutcome) -> str:
    line = outcome.line
    counts = line["continuations"]
    measured = sorted(r.postfork_s for r in outcome.records
                      if r.sweep_phase == "measured" and r.complete)
    median = f"{float(np.median(measured)):.1f} s" if measured else "-"
    return (f"[sweep] {line['arm']} N={line['level']}: {counts['measured']} measured "
            f"(+{counts['warmup']} warm-up, {counts['drain']} drain, "
            f"{line['measured_failed']} failed) in {line['ended_s'] - line['started_s']:.0f} s;"
            f" median postfork {median}")
