"""The report's speculative-decoding section: acceptance per arm, from each response's own
metrics (vLLM's `--per-request-spec-decode-metrics summary`, which the launcher turns on with
speculative decoding: transport.client SPEC_FIELDS), and each arm's paired change against clean.

Compaction changes the text the drafter predicts, so acceptance may differ by arm, and with it
the time per output token. The acceptance rate is accepted / drafted tokens; the mean acceptance
length counts the always-accepted bonus token, 1 + accepted / verify steps (vLLM's own
definitions). The paired change is, per block, the arm's rate minus clean's, in percentage
points; its interval is the order-statistic interval of the median (bench.analysis.stats)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.stats import (
    MIN_BLOCKS_FOR_MEDIAN_INTERVAL,
    median_interval,
    median_or_none,
)
from compaction_bench.bench.report.document import Paragraph, Section, Table
from compaction_bench.bench.runfolder import REFERENCE_ARM as REFERENCE
from compaction_bench.common.markdown import MISSING, number, percent
from compaction_bench.transport.request import RequestRecord


def _sums(requests: Sequence[RequestRecord]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for r in requests:
        for key, value in (r.spec_decode or {}).items():
            out[key] += value
    return out


def acceptance(requests: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """(acceptance rate, mean acceptance length) of these requests together."""
    total = _sums(requests)
    rate = total["accepted_tokens"] / total["draft_tokens"] if total["draft_tokens"] else None
    length = 1 + total["accepted_tokens"] / total["steps"] if total["steps"] else None
    return rate, length


def spec_sections(analysis: RunAnalysis) -> list[Section]:
    """The section, where any arm's response stated its speculative decoding; else none."""
    arms = set(analysis.arms)
    stated = [r for r in analysis.records.requests
              if r.source in arms and r.spec_decode and r.block is not None]
    if not stated:
        return []
    by_arm: dict[str, list[RequestRecord]] = defaultdict(list)
    by_block: dict[tuple[str, int, str], list[RequestRecord]] = defaultdict(list)
    for r in stated:
        by_arm[r.source].append(r)
        assert r.block is not None
        by_block[(r.regime, r.block, r.source)].append(r)
    rows = []
    for arm in [a for a in analysis.arms if a in by_arm]:
        rate, length = acceptance(by_arm[arm])
        total = _sums(by_arm[arm])
        rows.append((arm, str(len(by_arm[arm])), str(total["draft_tokens"]),
                     str(total["accepted_tokens"]), percent(rate, 1, fraction=True),
                     number(length, 2), _change(arm, by_block)))
    section = Section("Speculative decoding per arm").add(
        Paragraph("From each response's own speculative-decoding metrics (vLLM "
                  "--per-request-spec-decode-metrics): acceptance rate = accepted / drafted "
                  "tokens; mean acceptance length = 1 + accepted / verify steps (the bonus "
                  "token counted). The change is the arm's rate minus clean's in the same "
                  f"block, in percentage points: the median over blocks, with its 95% "
                  f"interval from {MIN_BLOCKS_FOR_MEDIAN_INTERVAL} blocks."),
        Table(("arm", "requests", "draft tokens", "accepted", "acceptance rate",
               "mean acceptance length", "change vs clean, pp [95% CI] (n blocks)"),
              tuple(rows)))
    return [section]


def _change(arm: str, by_block: dict[tuple[str, int, str], list[RequestRecord]]) -> str:
    if arm == REFERENCE:
        return "reference"
    diffs = []
    for (regime, block, source), requests in by_block.items():
        clean = by_block.get((regime, block, REFERENCE))
        if source != arm or not clean:
            continue
        mine, theirs = acceptance(requests)[0], acceptance(clean)[0]
        if mine is not None and theirs is not None:
            diffs.append(100 * (mine - theirs))
    middle = median_or_none(diffs)
    if middle is None:
        return MISSING
    interval = median_interval(diffs)
    shown = f"{middle:+.1f}"
    if interval is not None:
        shown += f" [{interval.low:+.1f}, {interval.high:+.1f}]"
    return f"{shown} (n={len(diffs)})"
