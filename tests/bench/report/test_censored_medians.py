"""Issue 30, parts 4 and 5: a median is printed only where the censored blocks cannot move it
(else as the bound they leave, with the count), an interval's censored end is a bound in words
(never inf in a table), and where an arm's and clean's medians stand side by side the ratio of
medians and the median of paired changes are both printed, each named."""

from __future__ import annotations

import re

import numpy as np

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.analysis.stats import paired_change
from compaction_bench.bench.analysis.summary import build_summary
from compaction_bench.bench.report.changes import change_cell
from compaction_bench.bench.report.compare import comparison_document
from compaction_bench.bench.report.document import to_html, to_markdown
from compaction_bench.bench.report.routing import routing_document
from compaction_bench.bench.report.run_report import build_document, pct
from compaction_bench.bench.runfolder import CENSORED, ArmRecord, BlockRecord, RunRecords

N, TRUE_PCT = 25, -18.0
INF = re.compile(r"\binf(inity)?\b|∞", re.IGNORECASE)


def wall_limited(seed: int = 3) -> tuple[np.ndarray, ...]:
    """n = 25 blocks whose arm is truly 18% faster at the median (arm/clean = 0.82 e^N(0, 0.1)),
    both sides stopped at a wall limit that cuts the 10 longest clean continuations (40%): the
    observed values, their censoring flags and the true values."""
    rng = np.random.default_rng(seed)
    clean = 60.0 * np.exp(rng.normal(0.0, 0.3, N))
    arm = clean * 0.82 * np.exp(rng.normal(0.0, 0.1, N))
    limit = float(np.sort(clean)[14:16].mean())
    return (np.minimum(arm, limit), np.minimum(clean, limit), arm > limit, clean > limit, arm,
            clean)


def test_forty_percent_censored_at_25_blocks_prints_the_bound_not_the_drifted_median() -> None:
    arm, clean, arm_cut, clean_cut, *_ = wall_limited()
    assert int(clean_cut.sum()) == 10 and int((arm_cut | clean_cut).sum()) == 10
    change = paired_change(arm, clean, arm_censored=arm_cut, reference_censored=clean_cut)
    assert change.median_pct is not None and change.median_pct - TRUE_PCT > 5  # drifted up
    cell = change_cell(change)
    assert not cell.startswith(pct(change.median_pct))
    assert re.match(r"[≥≤] ", cell) and "(10 of 25 censored)" in cell
    assert change.median_bound == "between"
    assert change.median_low_pct is not None and change.median_high_pct is not None
    assert change.median_low_pct <= TRUE_PCT <= change.median_high_pct
    assert not INF.search(cell)


def test_censoring_on_one_side_bounds_the_median_on_that_side() -> None:
    _, clean, _, clean_cut, true_arm, _ = wall_limited()
    # 10 of 25 references stopped, the arms finished: each such change is an upper bound, and
    # the 15 others still bound the median from below
    upper = paired_change(true_arm, clean, reference_censored=clean_cut)
    assert upper.median_bound == "between" and upper.median_high_pct == upper.median_pct
    # a majority stopped on one side: that side is unbounded
    at_most = paired_change([90.0] * 5, [100.0] * 5, reference_censored=[True] * 3 + [False] * 2)
    assert at_most.median_bound == "at most"
    assert change_cell(at_most) == "≤ -10.00% (3 of 5 censored) (n=5: no interval below 6 " \
        "blocks; [min, max] covers the median 93.8% only)"
    at_least = paired_change([90.0] * 5, [100.0] * 5, arm_censored=[True] * 3 + [False] * 2)
    assert at_least.median_bound == "at least"
    assert change_cell(at_least).startswith("≥ -10.00% (3 of 5 censored)")
    # both sides stopped in every block: no bound either way, said in words
    both = paired_change([100.0] * 6, [100.0] * 6, arm_censored=[True] * 6,
                         reference_censored=[True] * 6)
    assert both.median_bound == "unknown"
    assert change_cell(both) == ("unbounded both ways (6 of 6 censored) "
                                 "[unbounded below, unbounded above: censored]")


def test_without_censoring_the_plain_median_is_printed() -> None:
    *_, true_arm, true_clean = wall_limited()
    change = paired_change(true_arm, true_clean)
    assert change.median_bound == "exact"
    assert change.median_low_pct == change.median_high_pct == change.median_pct
    cell = change_cell(change)
    assert cell.startswith(f"{pct(change.median_pct)} [") and not re.search("[≥≤]", cell)


def test_censored_blocks_that_cannot_move_the_median_leave_it_plain_and_the_end_in_words(
) -> None:
    # the one arm-censored block is already the largest change: at +inf the median is the same
    change = paired_change([100.0] * 6, [80.0, 90.0, 95.0, 105.0, 110.0, 120.0],
                           arm_censored=[True, False, False, False, False, False])
    assert change.median_bound == "exact" and change.n_censored == 1
    cell = change_cell(change)
    assert cell.startswith(pct(change.median_pct) + " ") and "unbounded above: censored]" in cell
    assert not INF.search(cell)


def censored_run(run_id: str = "cut") -> RunRecords:
    """8 blocks of clean, external and placebo without spans (no load verdict); external stopped
    at the wall limit in 3 blocks and clean in one, the placebo in 2."""
    rng = np.random.default_rng(11)
    arms, blocks = [], []
    for block in range(1, 9):
        clean = 60.0 * float(np.exp(rng.normal(0.0, 0.2)))
        for arm, ratio, cut in (("clean", 1.0, block == 8), ("external", 0.8, block <= 3),
                                ("placebo", 1.0, block in (4, 5))):
            arms.append(ArmRecord(
                "dedicated", block, arm, "original", "complete",
                clean * ratio * float(np.exp(rng.normal(0.0, 0.05))),
                terminal_status=CENSORED if cut else "Submitted", rewrite_s=0.0,
                reasoning_tokens=int(1000 * ratio), completion_tokens=int(1500 * ratio),
                history_tokens=int(9000 * ratio), turns=5))
        blocks.append(BlockRecord("dedicated", block, ("clean", "external", "placebo")))
    return RunRecords(run_id=run_id, path=None, arms=tuple(arms), blocks=tuple(blocks),
                      manifest={"run_id": run_id, "task": "t", "profile": "synthetic",
                                "arms": ["clean", "external", "placebo"]})


def test_no_inf_reaches_a_rendered_table() -> None:
    first, second = analyze(censored_run("cut-a")), analyze(censored_run("cut-b"))
    postfork = first.primary["dedicated"].arms["external"].postfork
    assert postfork.n == 8 and postfork.n_censored == 4
    texts = [to_markdown(build_document(first, {})), to_html(build_document(first, {})),
             to_markdown(comparison_document([first, second])),
             to_markdown(routing_document("cut", {"a": first, "b": second}))]
    for text in texts:
        assert not INF.search(text), INF.search(text)
    assert "unbounded above: censored]" in texts[0]
    # the policy comparison bounds its medians by the same censored blocks
    policy = texts[0].split("## Policy comparison")[1].split("## ")[0]
    assert "(4 of 8 censored)" in policy
    summary = build_summary(first)["regimes"]["dedicated"]["arms"]["external"]
    assert summary["median_bound"] == postfork.median_bound
    assert summary["with_rewrite"]["median_bound"] == postfork.median_bound


def test_clean_median_is_context_and_side_by_side_medians_name_both_figures() -> None:
    analysis = analyze(censored_run())
    text = to_markdown(build_document(analysis, {}))
    assert "clean median (context, not the change's base)" in text
    assert "| clean median |" not in text
    tokens = analysis.primary["dedicated"].arms["external"].history_tokens
    assert tokens.ratio_of_medians_pct is not None
    assert f"ratio of medians {tokens.ratio_of_medians_pct:+.1f}%" in text
    assert "median of paired changes" in text
    compared = to_markdown(comparison_document([analysis, analyze(censored_run("b"))]))
    assert "clean median (context, not the change's base)" in compared
    summary = build_summary(analysis)["regimes"]["dedicated"]["arms"]["external"]
    assert summary["history_tokens"]["ratio_of_medians_pct"] == tokens.ratio_of_medians_pct
