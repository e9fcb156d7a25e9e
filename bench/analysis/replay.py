"""What a replay run (SOURCE=replay) shows beyond the paired changes: whose tokens were replayed
and whose time was measured, how faithfully the forced lengths were served, and how much of a
recorded arm's change comes from its shorter history and how much from its changed
continuation.

The split (per regime, over the complete original blocks): for a recorded arm `A` (the study's
`external`, which read the compacted history and then reasoned as the recording says) and its
history-only twin `A-history` (the same compacted history, continued with clean's recorded turns
and lengths), per block b

    total_b        = 100 (A_b - clean_b) / clean_b
    history_b      = 100 (A-history_b - clean_b) / clean_b
    continuation_b = 100 (A_b - A-history_b) / clean_b      (= total_b - history_b)

each reported as its median over blocks with its distribution-free interval (order statistics,
`bench.analysis.stats`). Medians do not add up exactly, so each part is its own paired statistic.

Arms that run side by side share the engine's batches: while clean prefills its longer
history, every arm's decode steps wait for it, so a history-only arm whose outputs are as long
as clean's finishes with clean and the history part reads as zero. Replay runs a block's arms one
after another by default (SIDE_BY_SIDE=0), each alone beside the regime's load; the report says
which way the run went beside the split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction_bench.bench.analysis.paired import POOLED, RunAnalysis, is_censored
from compaction_bench.bench.analysis.stats import PairedChange, median_interval, paired_change
from compaction_bench.bench.runfolder import REFERENCE_ARM, ArmRecord

HISTORY_SUFFIX = "-history"


@dataclass(frozen=True)
class Split:
    """A recorded arm's paired change in postfork time, and its two parts."""

    regime: str
    arm: str
    twin: str
    total: PairedChange
    history: PairedChange
    continuation_pct: tuple[float, ...]  # per block
    continuation_median_pct: float | None
    continuation_ci_pct: tuple[float, float] | None

    @property
    def n(self) -> int:
        return self.total.n


@dataclass(frozen=True)
class Forced:
    """How many of an arm's forced outputs came back at exactly their recorded length."""

    arm: str
    requests: int
    exact: int

    @property
    def share(self) -> float | None:
        return self.exact / self.requests if self.requests else None


@dataclass(frozen=True)
class SourceRow:
    """One replayed source: the recording, and the prompts as recorded and as served here."""

    source: str
    model: str | None
    recorded_by: str | None
    blocks: int
    recorded_prompt: Mapping[str, int | None]  # arm -> first turn, as the recording counted
    served_prompt: Mapping[str, int | None]  # arm -> first turn, this server's tokenizer
    freeform_tool_calls: int = 0  # sent as function calls (histories/format/freeform.py)


@dataclass(frozen=True)
class ReplayAnalysis:
    sources: tuple[SourceRow, ...]
    skipped: Mapping[str, str]
    continuation: Mapping[str, str]  # arm -> recorded | history-only
    forced: tuple[Forced, ...]
    splits: tuple[Split, ...]
    identical: tuple[str, ...]  # arms whose first request equalled clean's in every block
    tool_time: str | None
    measured_on: str
    recorded: Mapping[str, Any]  # source -> the recording's figures (manifest replay.recorded)
    side_by_side: bool  # whether the arms of a block ran at the same time

    @property
    def forced_total(self) -> Forced:
        return Forced("all", sum(f.requests for f in self.forced),
                      sum(f.exact for f in self.forced))


def identical_arms(records: Sequence[ArmRecord]) -> tuple[str, ...]:
    """Arms whose every checked first postfork request was identical to clean's (outside the
    recorded factors): nothing was compacted, so their 'change' is noise."""
    seen: dict[str, list[bool]] = {}
    for record in records:
        if record.arm == REFERENCE_ARM or not record.invariant:
            continue
        found = record.invariant.get("identical")
        if found is None and record.invariant.get("passed") is True:  # runs before the field
            fields = record.invariant.get("reasoning_fields")
            found = fields == [] if isinstance(fields, list) else None
        if isinstance(found, bool):
            seen.setdefault(record.arm, []).append(found)
    return tuple(sorted(arm for arm, flags in seen.items() if flags and all(flags)))


def _split(analysis: RunAnalysis, regime: str, arm: str, twin: str) -> Split | None:
    blocks = [b.primary for b in analysis.blocks
              if b.primary and (regime == POOLED or b.regime == regime)
              and (regime != POOLED or b.regime in analysis.pooled_regimes)]
    usable = [b for b in blocks if arm in b and twin in b and REFERENCE_ARM in b
              and b[REFERENCE_ARM].postfork_s > 0]
    if not usable:
        return None
    recorded, history, clean = ([b[name].postfork_s for b in usable]
                                for name in (arm, twin, REFERENCE_ARM))
    cut = {name: [is_censored(b[name]) for b in usable] for name in (arm, twin, REFERENCE_ARM)}
    parts = 100.0 * (np.asarray(recorded) - np.asarray(history)) / np.asarray(clean)
    # a replay cut by its wall limit makes the continuation part a bound of unknown direction
    interval = None if any(cut[arm]) or any(cut[twin]) else median_interval(parts)
    return Split(
        regime=regime, arm=arm, twin=twin,
        total=paired_change(recorded, clean, arm_censored=cut[arm],
                            reference_censored=cut[REFERENCE_ARM]),
        history=paired_change(history, clean, arm_censored=cut[twin],
                              reference_censored=cut[REFERENCE_ARM]),
        continuation_pct=tuple(float(p) for p in parts),
        continuation_median_pct=float(np.median(parts)),
        continuation_ci_pct=(interval.low, interval.high) if interval else None)


def analyze_replay(analysis: RunAnalysis) -> ReplayAnalysis | None:
    """The replay figures of a run, or None for a run of live agents."""
    manifest = analysis.records.manifest
    replay = manifest.get("replay")
    arms = [r for r in analysis.records.arms if r.source == "replay"]
    if not isinstance(replay, dict) or not arms:
        return None
    plans: Mapping[str, Any] = replay.get("plans") or {}
    served: Mapping[str, Any] = replay.get("served_prompt_tokens") or {}
    continuation = {arm: str(next((p.get("continuation") for p in by_source.values()
                                   if isinstance(p, dict)), "recorded"))
                    for arm, by_source in plans.items() if isinstance(by_source, dict)}
    forced = tuple(Forced(arm, sum(r.forced_requests or 0 for r in arms if r.arm == arm),
                          sum(r.forced_exact or 0 for r in arms if r.arm == arm))
                   for arm in analysis.arms)
    used = {r.record for r in arms if r.record and r.attempt == "original"}
    rows = []
    for source in replay.get("records") or []:
        by_arm = {arm: (plans.get(arm) or {}).get(source) or {} for arm in plans}
        first = {arm: ((plan.get("turns") or [{}])[0]) for arm, plan in by_arm.items()}
        clean = by_arm.get(REFERENCE_ARM) or {}
        rows.append(SourceRow(
            source=source, model=clean.get("model"), recorded_by=clean.get("recorded_by"),
            blocks=sum(1 for b in analysis.blocks if b.primary and any(
                r.record == source for r in b.primary.values())),
            recorded_prompt={arm: t.get("recorded_prompt_tokens") for arm, t in first.items()},
            served_prompt={arm: (counts or [None])[0]
                           for arm, counts in (served.get(source) or {}).items()},
            freeform_tool_calls=int(clean.get("freeform_tool_calls") or 0)))
    twins = [(arm[:-len(HISTORY_SUFFIX)], arm) for arm in analysis.arms
             if arm.endswith(HISTORY_SUFFIX) and arm[:-len(HISTORY_SUFFIX)] in analysis.arms]
    splits = [found for name in analysis.primary for arm, twin in twins
              if (found := _split(analysis, name, arm, twin)) is not None]
    hardware = manifest.get("hardware") or {}
    model = (manifest.get("server") or {}).get("profile", {}).get("model", {}) or {}
    measured = (f"{model.get('source') or manifest.get('profile')} on "
                f"{_machine(hardware)} (profile {manifest.get('profile')})")
    return ReplayAnalysis(
        sources=tuple(r for r in rows if r.source in used or r.blocks),
        skipped=dict(replay.get("skipped") or {}), continuation=continuation, forced=forced,
        splits=tuple(splits), identical=identical_arms(analysis.records.arms),
        tool_time=replay.get("tool_time"), measured_on=measured,
        recorded={k: v for k, v in (replay.get("recorded") or {}).items()
                  if isinstance(v, dict) and k in used},
        side_by_side=(manifest.get("config") or {}).get("side_by_side") is not False)


def _machine(hardware: Mapping[str, Any]) -> str:
    gpus = hardware.get("gpus")
    if isinstance(gpus, list) and gpus:
        names = [g.get("name") for g in gpus if isinstance(g, dict)]
        return f"{len(names)} x {names[0]}" if names else "GPU"
    cpu = hardware.get("cpu") or hardware.get("cpu_model")
    cores = hardware.get("cpus") or hardware.get("cpu_count")
    return f"{cpu or 'CPU'}{f', {cores} cores' if cores else ''}"
