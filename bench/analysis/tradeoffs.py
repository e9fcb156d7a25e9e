"""The policy comparison: every arm against clean on the same complete blocks, in time, tokens
and task success, with what its policy itself cost (scorer time and tokens, rewrite time).

Pure, from the run's records and its ledger. Blocks are the primary analysis's (`bench.analysis.
paired`: complete original blocks whose load was the regime's); every paired figure uses
`bench.analysis.stats.paired_change` (median paired % change, order-statistic interval over
blocks). Token totals are whole continuations (every postfork
request of the attempt), not equal-turn pairs: the second paper's point is that a policy changes
the trajectory, so its token cost is the trajectory's ("trajectory amplification"). Success is
the task's local validation; its paired change is the mean over blocks of (arm - clean) in
percentage points, with a percentile bootstrap interval over blocks (`common.resampling`), from
its own seeded stream (`comparison_rng`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compaction_bench.bench.analysis.paired import BlockStatus, comparison_rng
from compaction_bench.bench.analysis.stats import PairedChange, median_or_none, paired_change
from compaction_bench.bench.runfolder import REFERENCE_ARM, ArmRecord, RunRecords
from compaction_bench.common.files import read_jsonl
from compaction_bench.common.resampling import bootstrap_interval
from compaction_bench.transport.client import RequestRecord

LEDGER_FILE = "ledger.jsonl"


@dataclass(frozen=True)
class Continuation:
    """One complete attempt's totals: postfork time, request tokens, success, policy cost."""

    arm: str
    block: int
    postfork_s: float
    rewrite_s: float | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    success: bool | None
    requests: int
    scorer_s: float = 0.0
    scorer_tokens: int = 0
    censored: bool = False  # stopped at the wall limit: time and tokens are lower bounds

    @property
    def total_tokens(self) -> int | None:
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class SuccessChange:
    """Paired task success over n blocks: counts, and mean(arm - clean) in percentage points."""

    n: int
    arm_successes: int
    clean_successes: int
    difference_pp: float | None
    ci_low_pp: float | None
    ci_high_pp: float | None


@dataclass(frozen=True)
class PolicyRow:
    arm: str
    postfork: PairedChange
    input_tokens: PairedChange
    output_tokens: PairedChange
    cached_tokens: PairedChange
    reasoning_tokens: PairedChange
    success: SuccessChange
    rewrite_s_median: float | None
    scorer_s_median: float | None
    scorer_tokens_median: float | None
    devices: tuple[str, ...] = ()
    edits: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyComparison:
    """All arms of one regime: the paired rows (arms but clean) and every arm's continuations
    (clean too), which the Pareto figure draws."""

    regime: str
    blocks: tuple[int, ...]
    rows: tuple[PolicyRow, ...]
    continuations: Mapping[str, tuple[Continuation, ...]]


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _requests(records: RunRecords) -> dict[tuple[str, int, str, int], list[RequestRecord]]:
    """Original attempts' requests by (regime, block, arm, block pass)."""
    out: dict[tuple[str, int, str, int], list[RequestRecord]] = defaultdict(list)
    for r in records.requests:
        if r.block is None or r.labels.get("attempt", "original") != "original":
            continue
        out[(r.regime, r.block, r.source, int(r.labels.get("block_pass", 1)))].append(r)
    return out


def policy_ledger(records: RunRecords) -> list[dict[str, Any]]:
    """The run's policy decisions during continuations (`PolicyEdit` lines of ledger.jsonl)."""
    if records.path is None or not (records.path / LEDGER_FILE).is_file():
        return []
    return [line for line in read_jsonl(records.path / LEDGER_FILE).objects
            if line.get("kind") == "policy"
            and (line.get("context") or {}).get("phase") == "continuation"]


def _continuation(record: ArmRecord, requests: list[RequestRecord],
                  edits: list[dict[str, Any]]) -> Continuation:
    return Continuation(
        arm=record.arm, block=record.block, postfork_s=record.postfork_s,
        rewrite_s=record.rewrite_s, input_tokens=_sum([r.prompt_tokens for r in requests]),
        output_tokens=_sum([r.completion_tokens for r in requests]),
        cached_tokens=_sum([r.cached_tokens for r in requests]),
        reasoning_tokens=record.reasoning_tokens, success=record.validation,
        requests=len(requests), scorer_s=float(sum(e.get("scorer_s") or 0.0 for e in edits)),
        scorer_tokens=int(sum(e.get("scorer_tokens") or 0 for e in edits)),
        censored=record.censored)


def success_change(arm: Sequence[bool], clean: Sequence[bool],
                   rng: np.random.Generator) -> SuccessChange:
    """Paired success (module docstring); no interval below MIN_UNITS_FOR_INTERVAL blocks."""
    a = np.asarray(arm, dtype=float)
    c = np.asarray(clean, dtype=float)
    n = int(a.size)
    if n == 0:
        return SuccessChange(0, 0, 0, None, None, None)
    diff = 100.0 * (a - c)
    found = bootstrap_interval(diff, rng, "mean")
    low, high = found if found is not None else (None, None)
    return SuccessChange(n, int(a.sum()), int(c.sum()), float(diff.mean()), low, high)


def _pair(chosen: Sequence[Mapping[str, Continuation]], arm: str,
          value: Callable[[Continuation], float | None]) -> PairedChange:
    """The paired change, a block stopped at the wall limit on either side flagged as censored
    (its values are lower bounds: `paired_change` bounds the median and interval by them)."""
    arms, refs, arm_cut, ref_cut = [], [], [], []
    for block in chosen:
        a, c = value(block[arm]), value(block[REFERENCE_ARM])
        if a is None or c is None or c == 0:
            continue
        arms.append(a)
        refs.append(c)
        arm_cut.append(block[arm].censored)
        ref_cut.append(block[REFERENCE_ARM].censored)
    return paired_change(arms, refs, arm_censored=arm_cut, reference_censored=ref_cut)


def compare_policies(records: RunRecords, blocks: Sequence[BlockStatus], arms: Sequence[str],
                     *, seed: int = 0) -> dict[str, PolicyComparison]:
    """Per regime, every arm against clean over the primary analysis's complete blocks."""
    requests = _requests(records)
    edits: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for line in policy_ledger(records):
        context = line.get("context") or {}
        if context.get("attempt", "original") == "original":
            edits[(str(context.get("regime")), int(context.get("block") or 0),
                   str(line.get("policy")))].append(line)
    out: dict[str, PolicyComparison] = {}
    for regime in dict.fromkeys(b.regime for b in blocks):
        usable = [b for b in blocks if b.regime == regime and b.primary]
        chosen = [{arm: _continuation(
            record, requests.get((regime, b.block, arm, record.block_pass or 1), []),
            edits.get((regime, b.block, arm), [])) for arm, record in b.primary.items()}
            for b in usable]
        rows = []
        for arm in arms:
            if arm == REFERENCE_ARM or REFERENCE_ARM not in arms:
                continue

            def rng(metric: str, arm: str = arm, regime: str = regime) -> np.random.Generator:
                return comparison_rng(seed, "policies", regime, arm, metric)

            own = [b[arm] for b in chosen]
            outcomes = [(b[arm].success, b[REFERENCE_ARM].success) for b in chosen]
            known = [(a, c) for a, c in outcomes if a is not None and c is not None]
            counted: dict[str, int] = defaultdict(int)
            for b in usable:
                for line in edits.get((regime, b.block, arm), []):
                    counted[str(line.get("outcome"))] += 1
            rows.append(PolicyRow(
                arm=arm,
                postfork=_pair(chosen, arm, lambda c: c.postfork_s),
                input_tokens=_pair(chosen, arm, lambda c: c.input_tokens),
                output_tokens=_pair(chosen, arm, lambda c: c.output_tokens),
                cached_tokens=_pair(chosen, arm, lambda c: c.cached_tokens),
                reasoning_tokens=_pair(chosen, arm, lambda c: c.reasoning_tokens),
                success=success_change([a for a, _ in known], [c for _, c in known],
                                       rng("success")),
                rewrite_s_median=median_or_none([c.rewrite_s for c in own
                                                 if c.rewrite_s is not None]),
                scorer_s_median=median_or_none([c.scorer_s for c in own]),
                scorer_tokens_median=median_or_none([float(c.scorer_tokens) for c in own]),
                devices=tuple(sorted({str(line["device"]) for b in usable
                                      for line in edits.get((regime, b.block, arm), [])
                                      if line.get("device")})),
                edits=dict(counted)))
        out[regime] = PolicyComparison(
            regime=regime, blocks=tuple(b.block for b in usable), rows=tuple(rows),
            continuations={arm: tuple(b[arm] for b in chosen) for arm in arms})
    return out
