"""What a run folder offers the planner: its continuations, the engine's limits, its energy.

Read through the bench's own reader (`bench.runfolder.read_run`), so a damaged line is
skipped and counted there, never here. A *continuation* is one arm record: in a sweep, a
measured one (warm-up and drain continuations are counted, not planned) of the cell's last pass;
in a regime run, an original attempt of the block's last pass in a block whose load was valid.

Per continuation the planner needs, besides its postfork time:
- `cycle_s`: what one task costs the agent in wall time, postfork time plus the rewriting it
  did on the way (`rewrite_s`); the bench-only setup and history replay are left out;
- `resident_tokens`: the prompt + completion tokens of its largest request (its peak KV
  footprint);
- `busy_s`: the time at least one of its own requests (compressor requests included) was in
  flight: `busy_s / cycle_s` is its duty, the share of its time it occupies a sequence slot;
- its compressor tokens, and the arm file's one-time fork rewrite (`fork_rewrite_s`, T_R);
- in a regime run, its attributed GPU time and energy (plan.attribution).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.runfolder import ArmRecord, RunRecords, read_run
from compaction_bench.common.files import read_jsonl
from compaction_bench.plan.attribution import Attribution, RequestKey, continuation_requests
from compaction_bench.transport.request import RequestRecord

SWEEP = "sweep"
SWEEP_FILE = "sweep.jsonl"
HOST_NOTE = "Host contended"
GPU_FILE = "gpu.jsonl"
# The embedded CPU profile's model is far too small to reason (serve/profiles/cpu-tiny.toml).
NON_REASONING_PROFILES = ("cpu-tiny",)


@dataclass(frozen=True)
class Continuation:
    """One planned continuation (module docstring)."""

    arm: str
    condition: str  # "sweep" or the regime
    block: int
    postfork_s: float
    complete: bool
    level: int | None = None
    censored: bool = False  # stopped at the arm wall limit (TimeExceeded): its time is a bound
    agent: int | None = None
    index: int | None = None
    rewrite_s: float | None = None
    fork_rewrite_s: float | None = None
    rewrite_tokens: int | None = None
    fork_rewrite_tokens: int | None = None
    resident_tokens: int | None = None
    busy_s: float | None = None
    attempt: str = "original"
    block_pass: int = 1
    gpu_s: float | None = None  # regime runs: attributed GPU-seconds per GPU (plan.attribution)
    joules: float | None = None  # regime runs: attributed energy (NVML)

    @property
    def cycle_s(self) -> float:
        return self.postfork_s + (self.rewrite_s or 0.0)

    @property
    def pair_key(self) -> tuple[object, ...]:
        """What pairs it with the reference arm's continuation: in a sweep (level, agent,
        index), which share a sampling seed; in a regime run the block."""
        if self.condition == SWEEP:
            return (self.condition, self.level, self.agent, self.index)
        return (self.condition, self.block)


@dataclass(frozen=True)
class Engine:
    """The serving engine's limits as the run recorded them."""

    profile: str | None
    engine: str | None  # cpu | cuda | fake | None (imported runs)
    max_num_seqs: int | None
    kv_pool_tokens: int | None
    kv_source: str | None
    gpus_per_replica: int
    device: str
    reasons: bool  # False: the model cannot reason (the plan demonstrates the method)
    # replay (SOURCE=replay): the recorded reasoning models whose turns were replayed; their
    # recorded behaviour is what the plan prices on this server
    replayed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Window:
    """A span of the run clock (a sweep cell's measured window)."""

    start_s: float
    end_s: float


@dataclass(frozen=True)
class Observations:
    """Everything the planner reads from one run folder."""

    run_id: str
    path: Path
    manifest: Mapping[str, Any]
    continuations: tuple[Continuation, ...]
    excluded: dict[str, int]  # warm-up, drain, failed, earlier passes, invalid blocks
    engine: Engine
    windows: dict[tuple[str, int], Window]  # sweep cells' measured windows
    power: tuple[tuple[float, float], ...] | None  # (t_s, watts summed over GPUs); None: off
    gpu_names: tuple[str, ...]
    issues: int
    has_requests: bool
    records: RunRecords
    # sweep and search cells whose host was contended (their sweep.jsonl line's `host`), named
    # "arm N=level: figure" (issue 30: a busy machine makes a cell's times too long)
    contended: tuple[str, ...] = ()

    @property
    def is_sweep(self) -> bool:
        return any(c.condition == SWEEP for c in self.continuations)

    @property
    def arms(self) -> list[str]:
        listed = [a for a in self.manifest.get("arms") or [] if isinstance(a, str)]
        seen = {c.arm for c in self.continuations}
        return [a for a in listed if a in seen] + sorted(seen - set(listed))

    def of(self, arm: str, condition: str | None = None) -> list[Continuation]:
        return [c for c in self.continuations if c.arm == arm
                and (condition is None or c.condition == condition)]


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "None", "") else None
    except (TypeError, ValueError):
        return None


def _kv_pool(manifest: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The server's KV pool in tokens: num_gpu_blocks x block_size of vllm:cache_config_info,
    recorded by the sweep or by the self-check."""
    configs: list[tuple[str, Mapping[str, Any]]] = []
    sweep = manifest.get("sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("server_cache_config"), dict):
        configs.append(("manifest sweep.server_cache_config", sweep["server_cache_config"]))
    check = manifest.get("selfcheck")
    for entry in (check.get("checks") or []) if isinstance(check, dict) else []:
        data = entry.get("data") if isinstance(entry, dict) else None
        if isinstance(data, dict) and isinstance(data.get("cache_config"), dict):
            configs.append(("manifest selfcheck server check", data["cache_config"]))
    for where, config in configs:
        blocks, size = _int(config.get("num_gpu_blocks")), _int(config.get("block_size"))
        if blocks and size:
            return blocks * size, f"{where}: num_gpu_blocks {blocks} x block_size {size}"
        tokens = _int(config.get("kv_cache_size_tokens"))
        if tokens:
            return tokens, f"{where}: kv_cache_size_tokens"
    return None, None


def _dict(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _engine(manifest: Mapping[str, Any], gpu_names: tuple[str, ...]) -> Engine:
    profile = _dict(_dict(manifest, "server"), "profile")
    args, regime = _dict(profile, "engine_args"), _dict(manifest, "regime")
    seqs = _int(args.get("max_num_seqs")) or _int(regime.get("max_num_seqs"))
    kv, source = _kv_pool(manifest)
    name = manifest.get("profile") if isinstance(manifest.get("profile"), str) else None
    engine = profile.get("engine") if isinstance(profile.get("engine"), str) else None
    gpus = _int(profile.get("gpus")) or 1
    hardware = _dict(manifest, "hardware")
    cores = f", {hardware['cpu_count']} cores" if hardware.get("cpu_count") else ""
    device = (", ".join(sorted(set(gpu_names))) if gpu_names else
              f"CPU ({hardware['cpu']}{cores})" if hardware.get("cpu") else
              str(name or "unknown device"))
    replayed = _replayed(manifest)
    return Engine(profile=name, engine=engine, max_num_seqs=seqs, kv_pool_tokens=kv,
                  kv_source=source, gpus_per_replica=gpus, device=device,
                  reasons=bool(replayed) or name not in NON_REASONING_PROFILES,
                  replayed=replayed)


def _replayed(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The recorded models a replay run re-sent (from its manifest's plans), else ()."""
    if _dict(manifest, "config").get("source") != "replay":
        return ()
    plans = _dict(_dict(manifest, "replay"), "plans")
    models = {str(p.get("model")) for by_source in plans.values() if isinstance(by_source, dict)
              for p in by_source.values() if isinstance(p, dict) and p.get("model")}
    return tuple(sorted(models)) or ("recorded turns",)


def _request_figures(requests: Iterable[RequestRecord]
                     ) -> dict[RequestKey, tuple[int | None, float]]:
    """Per continuation (`request_key`): (largest prompt + completion, busy seconds)."""
    out: dict[RequestKey, tuple[int | None, float]] = {}
    for key, own in continuation_requests(requests).items():
        sizes = [r.prompt_tokens + (r.completion_tokens or 0) for r in own
                 if r.source == key[2] and r.prompt_tokens is not None]
        busy, edge = 0.0, float("-inf")
        for start, end in sorted((r.sent_s, r.end_s) for r in own if r.end_s is not None):
            if end > edge:  # the union of the request spans
                busy += end - max(start, edge)
                edge = end
        out[key] = (max(sizes) if sizes else None, busy)
    return out


def _tokens(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def continuation_key(r: ArmRecord) -> RequestKey:
    """The `request_key` of an arm record's requests."""
    return (r.regime, r.block, r.arm, r.block_pass or 1, r.attempt)


def _continuation(r: ArmRecord, figures: Mapping[RequestKey, tuple[int | None, float]]
                  ) -> Continuation:
    peak, busy = figures.get(continuation_key(r), (None, None))
    return Continuation(
        arm=r.arm, condition=r.regime, block=r.block, postfork_s=r.postfork_s,
        complete=r.complete, censored=r.censored, level=r.level, agent=r.sweep_agent,
        index=r.sweep_index,
        rewrite_s=r.rewrite_s, fork_rewrite_s=r.fork_rewrite_s,
        rewrite_tokens=_tokens(r.rewrite_prompt_tokens, r.rewrite_completion_tokens),
        fork_rewrite_tokens=_tokens(r.fork_rewrite_prompt_tokens,
                                    r.fork_rewrite_completion_tokens),
        resident_tokens=peak, busy_s=busy, attempt=r.attempt, block_pass=r.block_pass or 1)


def _attributed(c: Continuation, attribution: Attribution,
                by_key: Mapping[RequestKey, list[RequestRecord]]) -> Continuation:
    own = by_key.get((c.condition, c.block, c.arm, c.block_pass, c.attempt))
    if not own:
        return c
    share = attribution.share(own)
    return dataclasses.replace(c, gpu_s=share.gpu_s, joules=share.joules)


def _last_passes(path: Path) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], Window]]:
    """Sweep cells: the pass that finished each (arm, level), and its measured window."""
    passes: dict[tuple[str, int], int] = {}
    windows: dict[tuple[str, int], Window] = {}
    if not (path / SWEEP_FILE).is_file():
        return passes, windows
    for obj in read_jsonl(path / SWEEP_FILE).objects:
        arm, level = obj.get("arm"), _int(obj.get("level"))
        if obj.get("status") != "done" or not isinstance(arm, str) or level is None:
            continue
        passes[(arm, level)] = _int(obj.get("cell_pass")) or 1
        window = obj.get("measured_window_s")
        if isinstance(window, list) and len(window) == 2 and None not in window:
            windows[(arm, level)] = Window(float(window[0]), float(window[1]))
    return passes, windows


def contended_cells(path: Path, passes: Mapping[tuple[str, int], int]) -> tuple[str, ...]:
    """The finished cells (the pass the plan reads) whose host verdict was contended, each as
    'arm N=level: other processes used ...'."""
    if not (path / SWEEP_FILE).is_file():
        return ()
    found = []
    for obj in read_jsonl(path / SWEEP_FILE).objects:
        arm, level, host = obj.get("arm"), _int(obj.get("level")), obj.get("host")
        if (obj.get("status") != "done" or not isinstance(arm, str) or level is None
                or not isinstance(host, Mapping) or host.get("verdict") != "contended"
                or passes.get((arm, level)) != (_int(obj.get("cell_pass")) or 1)):
            continue
        found.append(f"{arm} N={level}: {host.get('figure') or 'contended'}")
    return tuple(dict.fromkeys(found))


def contended_note(obs: Observations) -> str | None:
    """The note naming a run's contended cells, or None where there are none."""
    if not obs.contended:
        return None
    return (f"{HOST_NOTE} in {obs.run_id} while {len(obs.contended)} cell(s) ran: "
            f"{'; '.join(obs.contended)}. Other processes on this machine took CPU, so these "
            "cells' times are longer than the server alone gives: measure them again on a "
            f"quiet machine (make bench RESUME={obs.run_id} QUIET_ONLY=1)")


def _power(path: Path) -> tuple[tuple[tuple[float, float], ...] | None, tuple[str, ...]]:
    """(t_s, watts summed over GPUs) from `gpu.jsonl`, or None where telemetry was off."""
    if not (path / GPU_FILE).is_file():
        return None, ()
    by_time: dict[float, float] = {}
    names: set[str] = set()
    for obj in read_jsonl(path / GPU_FILE).objects:
        if obj.get("telemetry") == "off" or not isinstance(obj.get("power_w"), int | float):
            continue
        t = round(float(obj["t_s"]), 1)  # the GPUs of one sample share a time stamp
        by_time[t] = by_time.get(t, 0.0) + float(obj["power_w"])
        if isinstance(obj.get("name"), str):
            names.add(obj["name"])
    if not by_time:
        return None, ()
    return tuple(sorted(by_time.items())), tuple(sorted(names))


def observe(path: Path) -> Observations:
    """Read a run folder for planning (module docstring)."""
    records = read_run(path)
    figures = _request_figures(records.requests)
    passes, windows = _last_passes(path)
    invalid = {(b.regime, b.block) for b in records.blocks if b.invalid_reasons}
    last_pass: dict[tuple[str, int], int] = {}
    for r in records.arms:
        if r.regime != SWEEP:
            key = (r.regime, r.block)
            last_pass[key] = max(last_pass.get(key, 1), r.block_pass or 1)
    kept: list[Continuation] = []
    excluded: dict[str, int] = {}

    def skip(reason: str) -> None:
        excluded[reason] = excluded.get(reason, 0) + 1

    for r in records.arms:
        if r.regime == SWEEP:
            if r.level is None or (r.arm, r.level) not in passes:
                skip("sweep cell not finished")
            elif (r.block_pass or 1) != passes[(r.arm, r.level)]:
                skip("earlier pass of its cell")
            elif r.sweep_phase != "measured":
                skip(str(r.sweep_phase or "unflagged"))
            else:
                kept.append(_continuation(r, figures))
            continue
        if r.attempt != "original":
            skip("recovery run (sensitivity only)")
        elif (r.block_pass or 1) != last_pass.get((r.regime, r.block), 1):
            skip("earlier pass of its block")
        elif (r.regime, r.block) in invalid:
            skip("block with invalid load")
        else:
            kept.append(_continuation(r, figures))
    power, names = _power(path)
    if records.requests and any(c.condition != SWEEP for c in kept):
        attribution = Attribution(records.requests, power)
        by_key = continuation_requests(records.requests)
        kept = [c if c.condition == SWEEP else _attributed(c, attribution, by_key)
                for c in kept]
    return Observations(
        run_id=records.run_id, path=path, manifest=records.manifest,
        continuations=tuple(kept), excluded=excluded, engine=_engine(records.manifest, names),
        windows=windows, power=power, gpu_names=names, issues=len(records.issues),
        has_requests=bool(records.requests), records=records,
        contended=contended_cells(path, passes))
