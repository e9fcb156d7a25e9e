"""A run folder across invocations: which run this is (its fingerprint), which blocks are done,
which pass a block cut short runs as, and the settings a RESUME takes from the manifest."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from compaction_bench.bench.run.config import (
    PLACEBO,
    BenchConfig,
    BenchError,
)
from compaction_bench.bench.runfolder import (
    BlockRecord,
    load_manifest,
    manifest_field,
    read_run,
)
from compaction_bench.common.paths import histories_root
from compaction_bench.histories.policies.registry import parse_arm
from compaction_bench.serve.profile import Profile

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This boot's id (Linux), or None where the system has none: a monotonic clock counts from
    its boot, so two boots' readings do not line up."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def clock_fields(origin: float) -> dict[str, Any]:
    """What a manifest records about its run clock: the monotonic origin, the wall time at that
    origin and the boot it was read in (`resumed_origin`)."""
    return {"clock_origin_monotonic": origin,
            "clock_origin_wall": time.time() - (time.monotonic() - origin),
            "boot_id": boot_id()}


def resumed_origin(manifest: dict[str, Any], *, boot: str | None, monotonic_now: float,
                   wall_now: float) -> float:
    """The run clock's origin on this monotonic clock, for RESUME. In the boot that started the
    run it is the recorded origin. After a reboot the monotonic clock restarted, so the recorded
    origin would put new records before or among the old ones (issue 22): the origin is moved
    so that the run clock keeps counting wall time since the run started. A manifest without a
    boot id or wall origin (older runs) keeps its recorded origin."""
    recorded = float(manifest["clock_origin_monotonic"])
    was, wall = manifest.get("boot_id"), manifest.get("clock_origin_wall")
    if was is None or boot is None or was == boot or not isinstance(wall, (int, float)):
        return recorded
    return monotonic_now - (wall_now - float(wall))


def history_paths(task: str, arms: tuple[str, ...]) -> dict[str, Path]:
    """Each arm's history file; `placebo` is clean's very file under another name, and
    `self-inline` continues clean's file too (it compacts in context, at run time)."""
    root = histories_root() / task
    def own_file(arm: str) -> bool:
        return arm != PLACEBO and parse_arm(arm).kind != "inline"

    paths = {arm: root / f"{arm if own_file(arm) else 'clean'}.json" for arm in arms}
    missing = sorted({str(p) for p in paths.values() if not p.is_file()})
    if missing:
        raise BenchError(f"missing arm histories: {', '.join(missing)}; make them with "
                         f"`make histories TASK={task}`")
    return paths


def fingerprint(config: BenchConfig, profile: Profile, paths: dict[str, Path]) -> dict[str, Any]:
    """What makes two runs the same run: a RESUME must match it field by field."""
    return {"regime": config.regime, "task": config.task, "arms": list(config.arms),
            "seed": config.seed, "seeds": config.seeds, "cache": config.cache,
            "source": config.source, "records": list(config.records),
            "side_by_side": config.side_by_side, "tool_time": config.tool_time,
            "protocol": config.protocol_for(profile), "rewrite_cache": config.rewrite_cache,
            "profile": profile.name, "step_limit": config.step_limit, "prompt": config.prompt,
            "fast_start": config.fast_start,
            **({"background_max_tokens": config.background_max_tokens}
               if config.background_max_tokens else {}),
            "histories": {a: hashlib.sha256(p.read_bytes()).hexdigest()
                          for a, p in paths.items()}}


def differences(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
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
        if changed := differences(was, prints):
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


def block_passes(run_dir: Path, regime: str, arms: tuple[str, ...]
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


def failed_arms(run_dir: Path, regime: str) -> list[tuple[int, str]]:
    records = read_run(run_dir).arms if (run_dir / "arms.jsonl").exists() else ()
    recovered = {(r.block, r.arm) for r in records if r.attempt == "recovery" and r.complete}
    return sorted({(r.block, r.arm) for r in records
                   if r.regime == regime and r.attempt == "original" and not r.complete}
                  - recovered)
