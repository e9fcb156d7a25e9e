"""`make bench`: three-arm blocks of one task under one regime, recorded into a run folder.

The run folder gets its manifest first, then raw records appended as they happen (arms,
requests, blocks, server metrics, GPU telemetry), then `summary.json` and the report from the
same analysis code as `make report`. `RESUME=<run-id>` continues an interrupted run without
redoing blocks that have records; `--recover` re-runs failed arms as recovery runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from bench.analysis.runfolder import (
    ArmRecord,
    load_manifest,
    manifest_field,
    read_run,
    write_json,
)
from bench.report.run_report import ReportFiles, write_report
from bench.run.arm import Arm, arm_for
from bench.run.block import run_block
from bench.run.config import BenchConfig, default_blocks, regime_users
from bench.run.manifest import build_manifest, history_hashes
from bench.run.progress import Progress
from bench.run.writer import RunWriter
from common.errors import SuiteError
from common.paths import histories_root
from histories.agent.chat import ChatModelConfig, config_for_profile
from histories.compaction.compactor import CompressorConfig, external_compressor, self_compressor
from histories.format.history import load_history
from histories.tasks.task import Task, load_task
from loadgen.background import BackgroundLoad
from serve.launcher import ServerConfig, is_healthy, server_for, server_version
from serve.profile import EXTERNAL_COMPRESSOR_PROFILE, Profile, load_profile, resolve_profile


class BenchError(SuiteError):
    """A run cannot start or had to stop; the message says why and what to do."""


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    records: list[ArmRecord]
    report: ReportFiles | None
    aborted: str | None


def history_paths(task: str, arms: tuple[str, ...]) -> dict[str, Path]:
    root = histories_root() / task
    paths = {arm: root / f"{arm}.json" for arm in arms}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise BenchError(f"missing arm histories: {', '.join(missing)}; make them with "
                         f"`make histories TASK={task}`")
    return paths


def open_run(config: BenchConfig) -> tuple[str, Path, dict[str, object] | None]:
    """(run id, folder, existing manifest or None). A new run id is regime + UTC time."""
    results = Path(config.results_dir)
    if config.resume:
        run_dir = results / config.resume
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.is_file():
            known = sorted(p.parent.name for p in results.glob("*/manifest.json"))
            raise BenchError(f"cannot resume {config.resume}: {manifest_path} does not exist "
                             f"(runs in {results}: {', '.join(known) or 'none'})")
        manifest = load_manifest(manifest_path)  # what resuming reads is checked up front
        regime = manifest_field(manifest, manifest_path, "config.regime", str)
        manifest_field(manifest, manifest_path, "regime.blocks", int)
        manifest_field(manifest, manifest_path, "clock_origin_monotonic", (int, float))
        if regime != config.regime:
            raise BenchError(f"run {config.resume} measured regime {regime}, not "
                             f"{config.regime}; pass REGIME={regime}")
        return config.resume, run_dir, manifest
    run_id = config.run_id or f"{config.regime}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    run_dir = results / run_id
    if run_dir.exists():
        raise BenchError(f"{run_dir} exists; pass RESUME={run_id} to continue it")
    run_dir.mkdir(parents=True)
    return run_id, run_dir, None


def build_arms(config: BenchConfig, paths: dict[str, Path],
               compressors: dict[str, CompressorConfig], run_dir: Path) -> list[Arm]:
    """Load each arm's history and its policy, and check the reasoning-only invariant."""
    histories = {arm: load_history(path) for arm, path in paths.items()}
    clean_path = histories_root() / config.task / "clean.json"
    clean = histories.get("clean") or (load_history(clean_path) if clean_path.is_file() else None)
    return [arm_for(arm, histories[arm], clean, compressors=compressors,
                    history_path=paths[arm], ledger_path=run_dir / "ledger.jsonl")
            for arm in config.arms]


@contextmanager
def _compressors(config: BenchConfig, profile: Profile, target_url: str
                 ) -> Iterator[dict[str, CompressorConfig]]:
    """`self`: the target's own `compressor` name. `external`: EXTERNAL_URL, or on CPU the
    embedded Gemma server on port + 1 (started here if it is not already running)."""
    found = {"self": self_compressor(target_url, model=profile.model.compressor_name,
                                     prompt=config.prompt)}
    if "external" not in config.arms:
        yield found
        return
    if config.external_url is None and profile.engine != "cpu":
        raise BenchError("the external arm needs another model's endpoint on a GPU profile: "
                         "pass EXTERNAL_URL=<OpenAI-compatible /v1 URL> (key in "
                         "$COMPRESSOR_API_KEY), or ARMS=clean,self")
    external = ServerConfig(profile=load_profile(EXTERNAL_COMPRESSOR_PROFILE),
                            port=config.port + 1)
    with server_for(external, config.external_url) as url:
        # the embedded Gemma is a base model that rambles: its first draft is capped per word
        per_word = None if config.external_url else 2.0
        found["external"] = external_compressor(url, prompt=config.prompt,
                                                max_tokens_per_raw_word=per_word)
        yield found


def _done_blocks(run_dir: Path, regime: str) -> set[int]:
    if not (run_dir / "arms.jsonl").exists():
        return set()
    return {r.block for r in read_run(run_dir).arms
            if r.regime == regime and r.attempt == "original"}


def _failed_arms(run_dir: Path, regime: str) -> list[tuple[int, str]]:
    records = read_run(run_dir).arms if (run_dir / "arms.jsonl").exists() else ()
    recovered = {(r.block, r.arm) for r in records if r.attempt == "recovery" and r.complete}
    return sorted({(r.block, r.arm) for r in records
                   if r.regime == regime and r.attempt == "original" and not r.complete}
                  - recovered)


@contextmanager
def _telemetry(config: BenchConfig, url: str, run_dir: Path, origin: float,
               users: int, profile: Profile) -> Iterator[BackgroundLoad | None]:
    """Server metrics and GPU samplers for the whole run, background users when the regime
    has any (started before the first block and steady before it begins)."""
    from loadgen.background import BackgroundConfig, ReplayOptions
    from loadgen.gpu import GpuSampler
    from loadgen.metrics import MetricsSampler

    with ExitStack() as stack:
        stack.enter_context(MetricsSampler(url, run_dir / "metrics.jsonl", origin=origin))
        stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin))
        if users:
            # Small models without a reasoning field or tool calls get old reasoning and tool
            # calls inline as text, so background prompts keep realistic lengths.
            replay = ReplayOptions(
                reasoning="keep" if profile.model.reasoning == "native" else "inline",
                tool_calls="keep" if profile.model.tool_calls else "inline")
            load = stack.enter_context(BackgroundLoad(BackgroundConfig(
                server_url=url, model=profile.model.target_name, users=users,
                regime=config.regime, out=run_dir / "requests.jsonl", origin=origin,
                workers=config.locust_workers, seed=config.seed, replay=replay,
                spawn_rate=max(1.0, users / 10), max_model_len=profile.engine_args.max_model_len,
                state_dir=run_dir / "background")))
            load.wait_steady(timeout_s=600)
            yield load
        else:
            yield None


def run_bench(config: BenchConfig, *, stream: TextIO = sys.stderr) -> RunOutcome:
    profile = resolve_profile(config.profile)
    task = load_task(config.task)
    task.check_runnable()
    paths = history_paths(config.task, config.arms)
    run_id, run_dir, manifest = open_run(config)
    users = regime_users(config.regime, profile)
    total = config.blocks or (int(manifest["regime"]["blocks"]) if manifest  # type: ignore[index]
                              else default_blocks(config.regime, profile))
    done = _done_blocks(run_dir, config.regime)
    origin = float(manifest["clock_origin_monotonic"]) if manifest else time.monotonic()  # type: ignore[arg-type]
    records: list[ArmRecord] = []
    aborted = None
    with server_for(ServerConfig(profile=profile, port=config.port), config.server_url) as url, \
            _compressors(config, profile, url) as compressors:
        arms = build_arms(config, paths, compressors, run_dir)
        model = config_for_profile(profile, url, config.seed)
        if manifest is None:
            manifest = build_manifest(config, profile, run_id=run_id, api_url=url,
                                      server_version=server_version(url),
                                      histories=history_hashes(paths), users=users, blocks=total)
            manifest["clock_origin_monotonic"] = origin
            manifest["structured_text"] = model.structured_text
            write_json(run_dir / "manifest.json", manifest)
        print(f"[bench] run {run_id}: {config.regime}, {users} background users, blocks "
              f"{len(done)}/{total} already done, arms {', '.join(config.arms)} -> {run_dir}",
              file=stream, flush=True)
        writer = RunWriter(run_dir, origin)
        progress = Progress(total_blocks=total, url=url, stream=stream)
        progress.done = len(done)
        todo = [b for b in range(1, total + 1) if b not in done]
        try:
            with _telemetry(config, url, run_dir, origin, users, profile) as load:
                progress.start()
                for block in todo:
                    if load is not None:
                        load.set_block(block)  # background records carry the block they overlap
                    records += _one_block(config, task, model, arms, block, writer, progress,
                                          run_id)
                    if not is_healthy(url):
                        aborted = (f"the server at {url} stopped answering during block {block}"
                                   f"; finished records are in {run_dir}; after restarting it, "
                                   f"continue with RESUME={run_id}")
                        break
                if config.recover and aborted is None:
                    records += _recover(config, task, model, arms, run_dir, writer, run_id)
        finally:
            progress.stop()
            writer.close()
    report = None if not records and not done else write_report(run_dir, seed=config.seed)
    return RunOutcome(run_dir=run_dir, records=records, report=report, aborted=aborted)


def _one_block(config: BenchConfig, task: Task, model: ChatModelConfig, arms: list[Arm],
               block: int, writer: RunWriter, progress: Progress, run_id: str,
               ) -> list[ArmRecord]:
    rng = np.random.default_rng([config.seed, block])
    started = time.monotonic()
    for arm in arms:
        progress.arm_started(arm.name)
    try:
        return run_block(arms, task=task, config=model, regime=config.regime, block=block,
                         rng=rng, writer=writer, step_limit=config.step_limit,
                         cache_salt=run_id if config.cache_salt_per_arm else None)
    finally:
        for arm in arms:
            progress.arm_finished(arm.name)
        progress.block_finished(time.monotonic() - started)


def _recover(config: BenchConfig, task: Task, model: ChatModelConfig, arms: list[Arm],
             run_dir: Path, writer: RunWriter, run_id: str) -> list[ArmRecord]:
    """Re-run each failed original arm alone, later than its block: a recovery run."""
    by_arm = {a.name: a for a in arms}
    out: list[ArmRecord] = []
    for block, arm in _failed_arms(run_dir, config.regime):
        out += run_block([by_arm[arm]], task=task, config=model, regime=config.regime,
                         block=block, rng=np.random.default_rng(0), writer=writer,
                         attempt="recovery", step_limit=config.step_limit,
                         cache_salt=run_id if config.cache_salt_per_arm else None)
    return out
