"""The analysis of one run: a pure function from raw records to every figure the report shows.

Block selection follows the design's protocol rules. The primary analysis uses complete original
blocks only: every expected arm has exactly one original record and it completed. The sensitivity
analysis replaces a failed original arm with its first complete recovery run; it is reported beside
the primary one and never mixed into it. Each paired figure compares an arm with `clean` inside
the same block, and its interval is the distribution-free interval of a median over blocks (see
`bench.analysis.stats`).
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compaction_bench.bench.analysis.host import HostVerdict, block_hosts
from compaction_bench.bench.analysis.latency import (
    CacheCheck,
    CacheRate,
    SourceLatency,
    cache_checks,
    cache_rates,
    latencies,
    max_waiting,
)
from compaction_bench.bench.analysis.load import BlockLoad, block_loads
from compaction_bench.bench.analysis.power import Sensitivity, noise_figures
from compaction_bench.bench.analysis.serving import serving_figures
from compaction_bench.bench.analysis.stats import PairedChange, median_or_none, paired_change
from compaction_bench.bench.runfolder import (
    REFERENCE_ARM,
    ArmRecord,
    RunRecords,
    arm_sort_key,
    regime_sort_key,
    sorted_unique,
)

POOLED = "pooled"
BlockKey = tuple[str, int]

HELPER_WAIT_LIMIT_S = 1.0  # a longer wait for a lazy helper start: the block is not fair


def helper_waits(records: Iterable[ArmRecord]) -> list[str]:
    """Why a block is not a fair comparison: each arm that waited longer than the limit for its
    compressor server's lazy start (the other arms ran on, with the server to themselves)."""
    return [f"arm {r.arm} waited {r.helper_wait_s:.0f} s for its compressor server to start: "
            "the arms did not run side by side" for r in records
            if (r.helper_wait_s or 0.0) > HELPER_WAIT_LIMIT_S]


@dataclass(frozen=True)
class BlockStatus:
    """How one block enters the analyses.

    `primary` holds the original record per arm when the block is complete, else is empty;
    `sensitivity` holds the records after recovery substitution when that makes it usable.
    `reasons` says why the block is not usable in the primary analysis; a block whose load was
    not the regime's (`load_reasons`) is usable in neither, nor is one without its block record
    (issue 22: its arms finished, the block did not). `load.verdict` says whether the regime's
    load was verified; an unverified block stays in, and the report names it. `host` says
    whether other processes on the host used its CPUs while the arms ran (issue 30): a contended
    block stays in unless the run set QUIET_ONLY, and the report names it.
    """

    regime: str
    block: int
    order: tuple[str, ...]
    primary: Mapping[str, ArmRecord]
    sensitivity: Mapping[str, ArmRecord]
    substituted: tuple[str, ...]
    reasons: tuple[str, ...]
    load: BlockLoad | None = None
    host: HostVerdict | None = None

    @property
    def quiet(self) -> bool:
        return self.host is not None and self.host.quiet

    @property
    def load_reasons(self) -> tuple[str, ...]:
        return self.load.reasons if self.load is not None else ()

    @property
    def key(self) -> BlockKey:
        return (self.regime, self.block)

    @property
    def complete(self) -> bool:
        return bool(self.primary)


@dataclass(frozen=True)
class ArmComparison:
    """One arm against clean over one set of blocks, for each measured quantity.

    `with_rewrite` (postfork + the continuation's rewriting) and `with_fork_rewrite` (that plus
    the one-time fork-prefix compaction, the study's serial T_K + T_R) cover only blocks where both
    arms recorded the values; the token changes cover only blocks where both arms recorded them
    and took the same number of postfork turns (the study compared tokens on equal-turn pairs),
    so their n can be smaller than `postfork.n`.
    """

    arm: str
    postfork: PairedChange
    with_rewrite: PairedChange
    with_fork_rewrite: PairedChange
    reasoning_tokens: PairedChange
    completion_tokens: PairedChange
    history_tokens: PairedChange


@dataclass(frozen=True)
class Comparison:
    """All arms against clean over the usable blocks of one regime (or of the pooled regimes)."""

    name: str
    regimes: tuple[str, ...]
    blocks: tuple[BlockKey, ...]
    clean_median_s: float | None
    clean_reasoning_median: float | None
    arms: Mapping[str, ArmComparison]

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)


@dataclass(frozen=True)
class FailureCount:
    regime: str
    arm: str
    attempt: str
    reason: str
    count: int


@dataclass(frozen=True)
class RunAnalysis:
    """Every figure of one run. Built once; the report and summary.json both read it."""

    records: RunRecords
    seed: int
    arms: tuple[str, ...]
    regimes: tuple[str, ...]
    pooled_regimes: tuple[str, ...]
    blocks: tuple[BlockStatus, ...]
    primary: Mapping[str, Comparison]
    sensitivity: Mapping[str, Comparison]
    failures: tuple[FailureCount, ...]
    latency: tuple[SourceLatency, ...]
    cache: tuple[CacheRate, ...]
    cache_check: tuple[CacheCheck, ...]
    max_waiting: Mapping[str, float | None]
    serving: Mapping[str, Mapping[str, Mapping[str, Any]]]
    noise: Sensitivity
    # QUIET_ONLY (issue 30): `primary` covers the quiet blocks only; `other` is the primary
    # analysis the other way (every usable block where quiet_only, the quiet ones where not)
    quiet_only: bool = False
    other: Mapping[str, Comparison] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.records.run_id

    def comparison(self, name: str, *, sensitivity: bool = False) -> Comparison | None:
        return (self.sensitivity if sensitivity else self.primary).get(name)

    def cache_rate(self, regime: str, source: str) -> CacheRate | None:
        return next((c for c in self.cache if c.regime == regime and c.source == source), None)


def expected_arms(records: RunRecords) -> tuple[str, ...]:
    """The arms every block should have: the manifest's list, else every arm any line names."""
    listed = records.manifest.get("arms")
    if isinstance(listed, list) and listed and all(isinstance(a, str) for a in listed):
        return tuple(sorted_unique(listed, arm_sort_key))
    named = [a.arm for a in records.arms] + [i.arm for i in records.issues if i.file == "arms.jsonl"
                                              and i.arm is not None]
    return tuple(sorted_unique(named, arm_sort_key))


def _issue_notes(records: RunRecords) -> dict[BlockKey, list[tuple[str | None, str]]]:
    """Broken arm lines that still name their block, so the block's reasons can cite them."""
    notes: dict[BlockKey, list[tuple[str | None, str]]] = defaultdict(list)
    for issue in records.issues:
        if issue.file == "arms.jsonl" and issue.regime is not None and issue.block is not None:
            text = f"{issue.where()}: {issue.reason}"
            notes[(issue.regime, issue.block)].append((issue.arm, text))
    return notes


def block_statuses(records: RunRecords, arms: Sequence[str]) -> tuple[BlockStatus, ...]:
    """Classify every block any file names: complete, usable only with recovery, or unusable
    (its arms failed, or its background load was not the regime's)."""
    loads = block_loads(records)
    hosts = block_hosts(records)
    by_block: dict[BlockKey, list[ArmRecord]] = defaultdict(list)
    for record in records.arms:
        by_block[(record.regime, record.block)].append(record)
    # A block cut by a crash is run again as a new pass: only the last pass's originals count.
    closed: dict[BlockKey, int] = {}
    for block in records.blocks:
        key = (block.regime, block.block)
        closed[key] = max(closed.get(key, 0), block.block_pass or 1)
    for key, lines in by_block.items():
        final = closed.get(key, max((r.block_pass or 1) for r in lines))
        by_block[key] = [r for r in lines if r.attempt != "original"
                         or (r.block_pass or 1) == final]
    orders = {(b.regime, b.block): b.order for b in records.blocks}
    notes = _issue_notes(records)
    keys = set(by_block) | set(orders) | set(notes)
    statuses = []
    for key in sorted(keys, key=lambda k: (regime_sort_key(k[0]), k[1])):
        lines = by_block.get(key, [])
        reasons: list[str] = []
        if not lines:
            reasons.append("no usable arm records")
        originals: dict[str, ArmRecord] = {}
        recovered: dict[str, ArmRecord] = {}
        substituted: list[str] = []
        for arm in arms:
            own = [r for r in lines if r.arm == arm and r.attempt == "original"]
            recovery = [r for r in lines if r.arm == arm and r.attempt == "recovery" and r.complete]
            cited = [text for who, text in notes.get(key, []) if who in (arm, None)]
            if len(own) > 1:
                reasons.append(f"arm {arm}: {len(own)} original records, expected one")
            elif not own:
                if lines:
                    reasons.append(f"arm {arm}: no usable original record"
                                   + (f" ({'; '.join(cited)})" if cited else ""))
            elif own[0].complete:
                originals[arm] = recovered[arm] = own[0]
            else:
                reasons.append(f"arm {arm} failed: {own[0].failure_reason}")
                if recovery:
                    recovered[arm] = recovery[0]
                    substituted.append(arm)
        if not lines and notes.get(key):
            reasons.extend(text for _, text in notes[key])
        if lines and key not in orders:
            # the arms finished but the block did not (server unhealthy after them, or a
            # crash in between): its load was never checked, so it is not complete
            reasons.append("no block record: the block did not finish after its arms, so its "
                           "load was never checked")
        load = loads.get(key)
        load_invalid = tuple(f"invalid load: {r}" for r in (load.reasons if load else ()))
        # an arm that waited for its compressor server's lazy start did not run side by side
        # with the others (they ran on, with the server to themselves): not a fair block
        load_invalid += tuple(helper_waits(r for r in lines if r.attempt == "original"))
        reasons.extend(load_invalid)
        complete = not reasons and len(originals) == len(arms)
        statuses.append(BlockStatus(
            regime=key[0],
            block=key[1],
            order=orders.get(key, ()),
            primary=originals if complete else {},
            sensitivity=(recovered if len(recovered) == len(arms) and lines and not load_invalid
                         else {}),
            substituted=tuple(substituted),
            reasons=tuple(reasons),
            load=load,
            host=hosts.get(key),
        ))
    return tuple(statuses)


def comparison_rng(seed: int, *labels: str) -> np.random.Generator:
    """A generator for one comparison, derived from the run's seed and the comparison's labels.

    Each interval draws from its own stream, so the same blocks give the same interval in the
    primary and the sensitivity analysis, and adding an arm does not move the others' intervals.
    """
    return np.random.default_rng([seed, *(zlib.crc32(label.encode()) for label in labels)])


def _paired(
    chosen: Sequence[Mapping[str, ArmRecord]],
    arm: str,
    value: Callable[[ArmRecord], float | None],
    *,
    equal_turns: bool = False,
    censored: bool = True,
) -> PairedChange:
    if equal_turns:
        chosen = [b for b in chosen if REFERENCE_ARM in b and b[arm].turns is not None
                  and b[arm].turns == b[REFERENCE_ARM].turns]
    # A run whose manifest lists no clean arm has nothing to pair with: n=0, not a KeyError.
    arms_, refs, arm_cut, ref_cut = [], [], [], []
    for block in chosen:
        if REFERENCE_ARM not in block:
            continue
        a, c = value(block[arm]), value(block[REFERENCE_ARM])
        if a is None or c is None or c == 0:
            continue
        arms_.append(a)
        refs.append(c)
        arm_cut.append(censored and is_censored(block[arm]))
        ref_cut.append(censored and is_censored(block[REFERENCE_ARM]))
    return paired_change(arms_, refs, arm_censored=arm_cut, reference_censored=ref_cut)


def is_censored(record: ArmRecord) -> bool:
    """Stopped by the wall limit: its time and tokens are lower bounds of the true ones."""
    return record.censored


def _with_rewrite(record: ArmRecord) -> float | None:
    return None if record.rewrite_s is None else record.postfork_s + record.rewrite_s


def _with_fork_rewrite(record: ArmRecord) -> float | None:
    """Postfork time plus all of this attempt's rewriting: the continuation's and the one-time
    fork-prefix compaction (0 for arms that rewrite nothing, such as clean)."""
    base = _with_rewrite(record)
    if base is None:
        return None
    return base + (record.fork_rewrite_s or 0.0)


def compare(
    name: str,
    regimes: Sequence[str],
    blocks: Sequence[BlockStatus],
    arms: Sequence[str],
    *,
    sensitivity: bool = False,
    quiet: bool = False,
) -> Comparison:
    """Every non-reference arm against clean over the usable blocks of `regimes` (with
    `quiet`, only those whose host was quiet)."""
    usable = [
        b for b in blocks
        if b.regime in regimes and (b.sensitivity if sensitivity else b.primary)
        and (b.quiet or not quiet)
    ]
    chosen = [b.sensitivity if sensitivity else b.primary for b in usable]
    results = {}
    for arm in arms:
        if arm == REFERENCE_ARM:
            continue
        results[arm] = ArmComparison(
            arm=arm,
            postfork=_paired(chosen, arm, lambda r: r.postfork_s),
            with_rewrite=_paired(chosen, arm, _with_rewrite),
            with_fork_rewrite=_paired(chosen, arm, _with_fork_rewrite),
            reasoning_tokens=_paired(chosen, arm, lambda r: r.reasoning_tokens,
                                     equal_turns=True),
            completion_tokens=_paired(chosen, arm, lambda r: r.completion_tokens,
                                      equal_turns=True),
            # the history at the fork is sent before any limit can cut: never censored
            history_tokens=_paired(chosen, arm, lambda r: r.history_tokens, censored=False),
        )
    clean = [b[REFERENCE_ARM] for b in chosen] if REFERENCE_ARM in arms else []
    return Comparison(
        name=name,
        regimes=tuple(regimes),
        blocks=tuple(b.key for b in usable),
        clean_median_s=median_or_none([r.postfork_s for r in clean]),
        clean_reasoning_median=median_or_none(
            [r.reasoning_tokens for r in clean if r.reasoning_tokens is not None]
        ),
        arms=results,
    )


def failure_counts(records: RunRecords) -> tuple[FailureCount, ...]:
    """Failed arm attempts counted by regime, arm, attempt and reason."""
    counts = Counter(
        (r.regime, r.arm, r.attempt, r.failure_reason) for r in records.arms if not r.complete
    )
    return tuple(
        FailureCount(regime, arm, attempt, reason, n)
        for (regime, arm, attempt, reason), n in sorted(
            counts.items(), key=lambda kv: (regime_sort_key(kv[0][0]), arm_sort_key(kv[0][1]))
        )
    )


def pooled_regimes(manifest: Mapping[str, Any], regimes: Sequence[str]) -> tuple[str, ...]:
    """The regimes pooled into one comparison: the manifest's `pooled_regimes`, else all."""
    listed = manifest.get("pooled_regimes")
    if isinstance(listed, list) and all(isinstance(r, str) for r in listed):
        return tuple(r for r in regimes if r in listed)
    return tuple(regimes)


def analyze(records: RunRecords, *, seed: int = 0) -> RunAnalysis:
    """Analyse one run's records. Deterministic for a given seed; never touches a server."""
    arms = expected_arms(records)
    blocks = block_statuses(records, arms)
    regimes = tuple(sorted_unique([b.regime for b in blocks], regime_sort_key))
    pooled = pooled_regimes(records.manifest, regimes)
    primary: dict[str, Comparison] = {}
    sensitivity: dict[str, Comparison] = {}
    groups = [(r, (r,)) for r in regimes] + ([(POOLED, pooled)] if pooled else [])
    quiet_only = quiet_only_setting(records.manifest)
    other: dict[str, Comparison] = {}
    for name, members in groups:
        primary[name] = compare(name, members, blocks, arms, quiet=quiet_only)
        sensitivity[name] = compare(name, members, blocks, arms, sensitivity=True,
                                    quiet=quiet_only)
        other[name] = compare(name, members, blocks, arms, quiet=not quiet_only)
    return RunAnalysis(
        records=records,
        seed=seed,
        arms=arms,
        regimes=regimes,
        pooled_regimes=pooled,
        blocks=blocks,
        primary=primary,
        sensitivity=sensitivity,
        failures=failure_counts(records),
        latency=latencies(records),
        cache=cache_rates(records),
        cache_check=cache_checks(records),
        max_waiting=max_waiting(records),
        serving=serving_figures(records),
        noise=noise_figures(_changes_by_arm(primary), _sizes(primary), seed=seed),
        quiet_only=quiet_only,
        other=other,
    )


def quiet_only_setting(manifest: Mapping[str, Any]) -> bool:
    """The run's QUIET_ONLY (its manifest's config; False where it has none)."""
    config = manifest.get("config")
    return isinstance(config, Mapping) and config.get("quiet_only") is True


def _sizes(primary: Mapping[str, Comparison]) -> set[int]:
    """The n of every primary postfork comparison: the sizes whose false-positive rate the
    report prints."""
    return {found.postfork.n for comparison in primary.values()
            for found in comparison.arms.values()}


def _changes_by_arm(primary: Mapping[str, Comparison]) -> dict[str, list[float]]:
    """Every arm's per-block postfork changes over the primary comparisons of single regimes."""
    out: dict[str, list[float]] = defaultdict(list)
    for name, comparison in primary.items():
        if name == POOLED:
            continue
        for arm, found in comparison.arms.items():
            out[arm].extend(found.postfork.changes_pct)
    return dict(out)
