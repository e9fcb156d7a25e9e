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

import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

from compaction_bench.bench.analysis.runfolder import ArmRecord, write_json
from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings
from compaction_bench.bench.run.compressors import build_arms, open_compressors
from compaction_bench.bench.run.config import SWEEP, BenchConfig
from compaction_bench.bench.run.fleet import CellOutcome, run_cell
from compaction_bench.bench.run.manifest import build_manifest, history_hashes
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.resume import fingerprint, history_paths, open_run, resumed_config
from compaction_bench.bench.run.runner import DEFAULT_KV_BLOCK, RunOutcome
from compaction_bench.bench.run.stop import RunStop
from compaction_bench.bench.run.telemetry import selfcheck
from compaction_bench.bench.run.watchdog import Watchdog
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.common.errors import ExitCode
from compaction_bench.common.files import JsonlWriter, RecordWriteError, read_jsonl
from compaction_bench.common.net import server_url
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.agent.sandbox import confinement
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.serve.engineinfo import cache_config
from compaction_bench.serve.launcher import ServerConfig, is_healthy, server_for, server_version
from compaction_bench.serve.profile import resolve_profile

SWEEP_FILE = "sweep.jsonl"
# On a CPU the embedded model cannot reason, so the sweep only shows the machinery: two model
# calls per continuation and the two arms on the one server keep `make bench REGIME=sweep`
# (levels 1..8) to minutes (with the task's step limit and three arms it took 20 min on 2
# cores). GPU profiles keep the task's step limit and the run's arms.
CPU_STEP_LIMIT = 2
CPU_ARMS = ("clean", "self")


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
    """Run every (arm, level) cell not done yet; see the module docstring. Stops as a block
    run does (bench/run/stop.py): a signal, the watchdog or unwritable records end it at once,
    the cut cell without its `sweep.jsonl` line, so `RESUME` runs it again as its next pass."""
    config = resumed_config(config)
    profile = resolve_profile(config.profile)
    if config.speculative is not None or config.expert_parallel is not None:
        profile = profile.with_features(speculative=config.speculative,
                                        expert_parallel=config.expert_parallel)
    config = sweep_config(config, profile.engine)
    task = load_task(config.task)
    task.check_runnable()
    sandbox = confinement()  # before anything starts: no unconfined agent unless asked
    paths = history_paths(config.task, config.arms)
    levels = config.sweep.levels_for(profile.engine_args.max_num_seqs)
    prints = {**fingerprint(config, profile, paths),
              "sweep": {**config.sweep.model_dump(mode="json"), "levels": list(levels)}}
    run_id, run_dir, manifest = open_run(config, prints)
    done, passes = finished_cells(run_dir)
    cells = [(level, arm) for level in levels for arm in config.arms]
    origin = float(manifest["clock_origin_monotonic"]) if manifest else time.monotonic()
    hint = f"finished cells are in {run_dir}; continue with RESUME={run_id}"
    stop = RunStop()
    records: list[ArmRecord] = []
    aborted = None
    phases = PhaseLog(run_dir, origin)  # where the wall time outside the cells goes
    invoked = time.monotonic()
    with stop.signals(stream), ExitStack() as run_stack:
        with phases.phase("server_start"):
            url = run_stack.enter_context(server_for(
                ServerConfig(profile=profile, port=config.port, fast_start=config.fast_start),
                config.server_url))
        compressors = run_stack.enter_context(
            open_compressors(config, profile, url, run_dir, origin, phases))
        with phases.phase("selfcheck"):
            check = selfcheck(config, url, profile, run_dir)
        arms = {a.name: a for a in build_arms(config, paths, compressors)}
        model = config_for_profile(profile, url, config.seed).model_copy(
            update={"request_timeout_s": config.stream_deadline_s})
        if manifest is None:
            manifest = build_manifest(config, profile, run_id=run_id, api_url=url,
                                      server_version=server_version(url),
                                      histories=history_hashes(paths), users=0,
                                      blocks=len(cells))
            manifest.update({"clock_origin_monotonic": origin, "fingerprint": prints,
                             "structured_text": model.structured_text, "selfcheck": check,
                             "sandbox": sandbox.describe(),
                             "sweep": {"levels": list(levels), "arms": list(config.arms),
                                       "step_limit": config.step_limit,
                                       "settings": config.sweep.model_dump(mode="json"),
                                       "server_cache_config": _server_cache_config(url)}})
            write_json(run_dir / "manifest.json", manifest)
        todo = [(n, a) for n, a in cells if (a, n) not in done]
        print(f"[sweep] run {run_id}: levels {', '.join(map(str, levels))}, arms "
              f"{', '.join(config.arms)}, {len(cells) - len(todo)}/{len(cells)} cells already "
              f"done, step limit {config.step_limit or task.spec.step_limit}, agent commands "
              f"confined by {sandbox.level} -> {run_dir}", file=stream, flush=True)

        def unwritable(exc: RecordWriteError) -> None:
            stop.stop(f"{exc}".splitlines()[0] + "; free space or fix the folder, then "
                      f"continue with RESUME={run_id}")

        writer = RunWriter(run_dir, origin, on_failure=unwritable)
        stop.on_stop = writer.cancel
        settings = BlockSettings(
            config=config, run_id=run_id, task=task, model=model,
            protocol=config.protocol_for(profile),
            block_size=profile.engine_args.block_size or DEFAULT_KV_BLOCK,
            ledger=Ledger(run_dir / "ledger.jsonl"))
        cells_out = JsonlWriter(run_dir / SWEEP_FILE)
        try:
            with ExitStack() as stack:
                from compaction_bench.loadgen.gpu import GpuSampler
                from compaction_bench.loadgen.metrics import MetricsSampler

                sampler = stack.enter_context(MetricsSampler(url, run_dir / "metrics.jsonl",
                                                             origin=origin))
                stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin))
                stack.enter_context(Watchdog(
                    url, config.stall_s, lambda why: _stop_for(stop, f"{why}; {hint}"),
                    healthy=is_healthy, sampler=sampler))
                records, aborted = _cells(levels, config, arms, done, passes, settings,
                                          writer, cells_out, stop, url, hint, stream)
        except KeyboardInterrupt as exc:
            stop.interrupted(exc)
        finally:
            cells_out.close()
            writer.close()
        phases.add("invocation", invoked, time.monotonic())
    if stop.reason is not None:
        aborted = stop.reason.message
        if "RESUME=" not in aborted:
            aborted += f"; {hint}"
    if aborted is None:
        print(f"[sweep] done: make plan RUN={run_id}", file=stream, flush=True)
    code = (stop.reason.exit_code if stop.reason is not None
            else ExitCode.FAILED if aborted else ExitCode.OK)
    return RunOutcome(run_dir=run_dir, records=records, report=None, aborted=aborted,
                      exit_code=code)


def _stop_for(stop: RunStop, message: str) -> None:
    stop.stop(message)


def _cells(levels: tuple[int, ...], config: BenchConfig, arms: dict[str, Arm],
           done: set[tuple[str, int]], passes: dict[tuple[str, int], int],
           settings: BlockSettings, writer: RunWriter, cells_out: JsonlWriter, stop: RunStop,
           url: str, hint: str, stream: TextIO) -> tuple[list[ArmRecord], str | None]:
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
                               stopped=lambda: stop.stopped)
            if stop.stopped:  # the cut cell gets no line: RESUME runs it again
                return records + outcome.records, None
            writer.sync()
            records += outcome.records
            cells_out.write(outcome.line)
            print(_cell_line(outcome), file=stream, flush=True)
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
    return (f"[sweep] {line['arm']} N={line['level']}: {counts['measured']} measured "
            f"(+{counts['warmup']} warm-up, {counts['drain']} drain, "
            f"{line['measured_failed']} failed) in {line['ended_s'] - line['started_s']:.0f} s;"
            f" median postfork {median}")
