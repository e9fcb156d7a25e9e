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
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import numpy as np

from bench.analysis.load import block_load
from bench.analysis.runfolder import ArmRecord, BlockRecord, read_run, write_json
from bench.report.run_report import ReportFiles, write_report
from bench.run.arm import Arm, arm_for
from bench.run.block import BlockSettings, run_block
from bench.run.config import PLACEBO, SWEEP, BenchConfig, default_blocks, regime_users
from bench.run.manifest import build_manifest, history_hashes
from bench.run.progress import Progress
from bench.run.writer import RunWriter
from common.errors import SuiteError
from common.files import JsonlWriter
from common.paths import histories_root
from histories.agent.chat import config_for_profile
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
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BenchError(f"cannot resume {config.resume}: {manifest_path} is not readable "
                             f"JSON ({exc}); start a new run") from None
        was = manifest.get("fingerprint") if isinstance(manifest, dict) else None
        if not isinstance(was, dict):
            raise BenchError(f"cannot resume {config.resume}: its manifest has no fingerprint "
                             "(made by an older version); start a new run")
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
    return [arm_for(arm, load_history(paths[arm]), compressors=compressors.configs, cache=cache,
                    before_request=compressors.hooks.get(arm)) for arm in config.arms]


@dataclass
class Compressors:
    """Each compaction arm's compressor, and what runs before its requests (a lazy start)."""

    configs: dict[str, CompressorConfig]
    hooks: dict[str, Callable[[], None]]


@contextmanager
def _compressors(config: BenchConfig, profile: Profile, target_url: str, run_dir: Path,
                 origin: float) -> Iterator[Compressors]:
    """`self`: the target's own `compressor` name. `external`: EXTERNAL_URL, or on CPU the
    embedded Gemma server on port + 1, started only when a block first needs a rewrite (on
    cpu-tiny none does: every block stays under the identity rule)."""
    if config.prompt not in REWRITE_PROMPTS:
        raise BenchError(f"unknown prompt {config.prompt!r}; use one of "
                         f"{', '.join(REWRITE_PROMPTS)}")
    found = Compressors({"self": self_compressor(
        target_url, model=profile.model.compressor_name, prompt=config.prompt)}, {})
    if "external" not in config.arms:
        yield found
        return
    if config.external_url is not None:
        with server_for(ServerConfig(profile=profile), config.external_url) as url:
            found.configs["external"] = external_compressor(url, prompt=config.prompt)
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
        found.configs["external"] = external_compressor(
            lazy.config.api_url, prompt=config.prompt, max_tokens_per_raw_word=2.0)
        found.hooks["external"] = lazy.ensure
        yield found
    finally:
        lazy.stop()


def _block_passes(run_dir: Path, regime: str, arms: tuple[str, ...]
                  ) -> tuple[set[int], dict[int, int]]:
    """(blocks done, the pass a block not done runs as). A block is done when its block record
    exists and every arm has its original record of that pass; a block a crash cut short
    (records of some arms, no block record) runs again in full as the next pass, and analysis
    uses only its last pass."""
    if not (run_dir / "arms.jsonl").exists():
        return set(), {}
    folder = read_run(run_dir)
    closed = {b.block: b.block_pass or 1 for b in folder.blocks if b.regime == regime}
    seen: dict[tuple[int, int], set[str]] = {}
    highest: dict[int, int] = {}
    for r in folder.arms:
        if r.regime == regime and r.attempt == "original":
            seen.setdefault((r.block, r.block_pass or 1), set()).add(r.arm)
            highest[r.block] = max(highest.get(r.block, 0), r.block_pass or 1)
    done = {b for b, p in closed.items() if set(arms) <= seen.get((b, p), set())}
    return done, {b: p + 1 for b, p in highest.items() if b not in done}


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


@contextmanager
def _telemetry(config: BenchConfig, url: str, run_dir: Path, origin: float, users: int,
               profile: Profile, probe: ServiceProbe | None) -> Iterator[LoadMonitor | None]:
    """Server metrics and GPU samplers for the whole run; background users when the regime has
    any, living exactly as long as the run (started before the first block and steady before
    it begins), with a monitor sampling them."""
    from loadgen.background import BackgroundConfig, ReplayOptions
    from loadgen.gpu import GpuSampler
    from loadgen.metrics import MetricsSampler

    with ExitStack() as stack:
        stack.enter_context(MetricsSampler(url, run_dir / "metrics.jsonl", origin=origin))
        stack.enter_context(GpuSampler(run_dir / "gpu.jsonl", origin=origin))
        if not users:
            yield None
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
        yield stack.enter_context(LoadMonitor(load, run_dir / "load.jsonl", origin))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def _signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C: cleanup runs, records stay, RESUME hint."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    paths = history_paths(config.task, config.arms)
    prints = fingerprint(config, profile, paths)
    run_id, run_dir, manifest = open_run(config, prints)
    users = regime_users(config.regime, profile)
    total = config.blocks or (int(manifest["regime"]["blocks"]) if manifest
                              else default_blocks(config.regime, profile))
    done, passes = _block_passes(run_dir, config.regime, config.arms)
    origin = float(manifest["clock_origin_monotonic"]) if manifest else time.monotonic()
    records: list[ArmRecord] = []
    aborted = None
    with _signals(), server_for(ServerConfig(profile=profile, port=config.port),
                                config.server_url) as url, \
            _compressors(config, profile, url, run_dir, origin) as compressors:
        check = _selfcheck(config, url, profile, run_dir)
        arms = build_arms(config, paths, compressors)
        model = config_for_profile(profile, url, config.seed)
        probe = _probe(url, profile, users)
        if manifest is None:
            manifest = build_manifest(config, profile, run_id=run_id, api_url=url,
                                      server_version=server_version(url),
                                      histories=history_hashes(paths), users=users, blocks=total)
            manifest.update({"clock_origin_monotonic": origin, "fingerprint": prints,
                             "structured_text": model.structured_text,
                             "service_probe": asdict(probe) if probe else None,
                             "selfcheck": check})
            write_json(run_dir / "manifest.json", manifest)
        print(f"[bench] run {run_id}: {config.regime}, {users} background users, blocks "
              f"{len(done)}/{total} already done, arms {', '.join(config.arms)} -> {run_dir}",
              file=stream, flush=True)
        writer = RunWriter(run_dir, origin)
        settings = BlockSettings(
            config=config, run_id=run_id, task=task, model=model,
            protocol=config.protocol_for(profile),
            block_size=profile.engine_args.block_size or DEFAULT_KV_BLOCK,
            ledger=Ledger(run_dir / "ledger.jsonl"))
        progress = Progress(total_blocks=total, url=url, stream=stream)
        progress.done = len(done)
        todo = [b for b in range(1, total + 1) if b not in done]
        try:
            with _telemetry(config, url, run_dir, origin, users, profile, probe) as monitor:
                progress.start()
                for block in todo:
                    if monitor is not None:
                        monitor.load.check()  # alive, authorised and answering, or stop here
                        monitor.load.set_block(block)
                        monitor.block = block
                    records += _one_block(arms, settings, block, writer, progress, users,
                                          passes.get(block, 1))
                    if not is_healthy(url):
                        aborted = (f"the server at {url} stopped answering during block {block}"
                                   f"; finished records are in {run_dir}; after restarting it, "
                                   f"continue with RESUME={run_id}")
                        break
                if config.recover and aborted is None:
                    records += _recover(arms, settings, run_dir, writer)
        except BackgroundLoadError as exc:
            aborted = (f"{exc}".splitlines()[0] + f"; the blocks so far are on record in "
                       f"{run_dir} (a block whose load failed is marked invalid); continue "
                       f"with RESUME={run_id}")
        except KeyboardInterrupt as exc:
            aborted = (f"interrupted ({exc or 'Ctrl-C'}); finished records are in {run_dir}; "
                       f"continue with RESUME={run_id}")
        finally:
            progress.stop()
            writer.close()
    report = None if not records and not done else write_report(run_dir, seed=config.seed)
    return RunOutcome(run_dir=run_dir, records=records, report=report, aborted=aborted)


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
               progress: Progress, users: int, block_pass: int) -> list[ArmRecord]:
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
    return outcome.records


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
