"""The report's policy sections, rendered from one `RunAnalysis`: the policy comparison (paired
time, tokens and success per arm, what each policy cost, the Pareto figure) and cache-break
accounting (predicted beside measured cached tokens, cache loss per arm, every disagreeing
request by id). `policy_summary` gives the same figures for summary.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compaction_bench.bench.analysis.cachebreak import ArmCache, CacheAccounting, cache_accounting
from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.stats import MIN_BLOCKS_FOR_MEDIAN_INTERVAL, PairedChange
from compaction_bench.bench.analysis.tradeoffs import (
    PolicyComparison,
    PolicyRow,
    SuccessChange,
    compare_policies,
)
from compaction_bench.bench.report.changes import interval_text, median_text, medians_text
from compaction_bench.bench.report.document import Bullets, Image, Paragraph, Section, Table
from compaction_bench.bench.report.pareto import pareto_figure
from compaction_bench.common.markdown import MISSING

LISTED = 40  # disagreeing requests listed by id in the report (all of them in summary.json)


@dataclass(frozen=True)
class PolicyFigures:
    comparisons: dict[str, PolicyComparison]
    cache: CacheAccounting


def policy_figures(analysis: RunAnalysis) -> PolicyFigures:
    return PolicyFigures(
        compare_policies(analysis.records, analysis.blocks, analysis.arms, seed=analysis.seed),
        cache_accounting(analysis.records, analysis.arms))


def _change(change: PairedChange, *, digits: int = 0) -> str:
    """Both medians with their ratio (named: context), then the median of paired changes."""
    if change.n == 0:
        return "n=0"
    medians = medians_text(change, digits)
    values = f"{medians}; median of paired changes " if medians else ""
    median = median_text(change, 1)
    interval = interval_text(change)
    if interval is None:
        return (f"{values}{median} (n={change.n}, no interval below "
                f"{MIN_BLOCKS_FOR_MEDIAN_INTERVAL})")
    return f"{values}{median} {interval} (n={change.n})"


def _success(s: SuccessChange) -> str:
    if s.n == 0:
        return "not recorded (n=0)"
    text = f"{s.arm_successes}/{s.n} vs clean {s.clean_successes}/{s.n}"
    if s.difference_pp is None:
        return text
    if s.ci_low_pp is None or s.ci_high_pp is None:
        return f"{text}; {s.difference_pp:+.0f} pp (no interval)"
    return f"{text}; {s.difference_pp:+.0f} pp [{s.ci_low_pp:+.0f}, {s.ci_high_pp:+.0f}]"


def _cost(row: PolicyRow) -> str:
    parts = [f"rewrite {row.rewrite_s_median:.2f} s" if row.rewrite_s_median is not None
             else "rewrite n/a"]
    if row.scorer_tokens_median:
        parts.append(f"scorer {row.scorer_s_median or 0:.2f} s, "
                     f"{row.scorer_tokens_median:.0f} tokens ({', '.join(row.devices) or '?'})")
    if row.edits:
        parts.append(", ".join(f"{k} {v}" for k, v in sorted(row.edits.items())))
    return "; ".join(parts)


def comparison_section(figures: PolicyFigures) -> Section:
    section = Section("Policy comparison").add(Paragraph(
        "Every arm against clean on the same complete original blocks (median paired change "
        "of 100 x (arm - clean) / clean, 95% order-statistic interval over blocks, n blocks). "
        "Tokens are whole continuations, every postfork request of the attempt (not equal-turn "
        "pairs: a policy that changes the trajectory pays for it in tokens). Success: the task's "
        "local validation, paired difference in percentage points. Policy cost: median rewrite "
        "time per continuation (compressor or scorer calls inside the request loop, charged to the "
        "arm), the scorer's seconds and input tokens, and what the policy did to each step."))
    for regime, comparison in figures.comparisons.items():
        if not comparison.rows:
            continue
        section.add(Table(
            ("Arm", "postfork time s", "input tokens", "output tokens", "cached tokens",
             "reasoning tokens", "task success", "policy cost"),
            tuple((r.arm, _change(r.postfork, digits=1), _change(r.input_tokens),
                   _change(r.output_tokens), _change(r.cached_tokens),
                   _change(r.reasoning_tokens), _success(r.success), _cost(r))
                  for r in comparison.rows),
            f"{regime}: {len(comparison.blocks)} complete block(s). Cells: arm median vs clean "
            "median with their ratio (context, not the compared figure); median of paired "
            "changes [95% CI] (n)."))
    if not any(c.blocks for c in figures.comparisons.values()):
        section.add(Paragraph("No complete blocks: nothing to compare (see 'Failures and "
                              "unusable blocks')."))
    png = pareto_figure(figures.comparisons)
    if png is not None:
        section.add(Image("policy_pareto.png", png,
                          "Postfork time against tokens per continuation. Diamonds: each arm's "
                          "medians over its complete blocks, coloured by validation (green: "
                          "passed in every block, orange: some, red: none); small markers: "
                          "single continuations (o passed, x failed); dashed: arms that no "
                          "other arm beats in both time and tokens. Labels: arm (continuations "
                          "that passed validation / n)."))
    return section


def _added(arm: ArmCache) -> str:
    if arm.arm == "clean":
        return "reference"
    median = arm.added_vs_clean_median
    if median is None:
        return MISSING
    return f"{median:+.0f} tokens (median, n={len(arm.added_vs_clean)})"


def cache_section(figures: PolicyFigures) -> Section:
    cache = figures.cache
    section = Section("Cache-break accounting").add(Paragraph(
        f"Each arm request's prefix-cache hit predicted from its rendered prompt's token ids "
        f"(vLLM's return_token_ids) and the run's own earlier requests, in {cache.block_size}-"
        f"token KV blocks (block size from the {cache.block_source}), beside the cached tokens "
        "the server reported. Low: what was surely cached when the request was sent; high: "
        "also what requests running beside it had cached by its first token. A request agrees "
        "when the measured hit is within one block of [low, high]. Loss: cached tokens of the "
        "arm's own previous request (prompt and reply) that this request could not reuse, "
        "predicted from where the prompt first departs from it, and measured; 'before the last "
        "reply': predicted loss where that departure lies in the previous prompt (a policy "
        "rewrote older history, not only the step just completed). Added prefill vs clean: per "
        "block, the arm's measured loss minus clean's, the prefill its rewriting adds."
        + (" Behind a router: one predicted cache per replica (each request's replica from the "
           "replicas' counters; a request whose replica is not known is not checked), so the "
           "predicted loss is the policy's own and the measured loss also holds what routing "
           "to another replica cost." if cache.per_replica else "")))
    if not cache.arms:
        section.add(Paragraph("No arm request carried token ids (a run with TOKEN_IDS=0, an "
                              "older run, or a server without return_token_ids): nothing to "
                              "predict."))
    else:
        section.add(Table(
            ("Regime", "Arm", "requests checked", "cached: measured", "cached: predicted "
             "low-high", "agree (exact)", "loss: predicted / measured",
             "of it before the last reply",
             "added prefill vs clean"),
            tuple((a.regime, a.arm, f"{a.n_checked}/{a.n_requests}", str(a.measured),
                   f"{a.predicted_low}-{a.predicted_high}", f"{a.n_agree}/{a.n_checked} "
                   f"({a.n_exact})", f"{a.loss_predicted} / {a.loss_measured}",
                   str(a.loss_old_text), _added(a))
                  for a in cache.arms),
            "Token sums over the arm's checked requests."))
    wrong = cache.disagreements
    warmer = sum(r.disagreement == "warmer" for r in wrong)
    section.add(Paragraph(
        f"Disagreements (measured outside [low - 1 block, high + 1 block]): {len(wrong)} of "
        f"{len(cache.requests)} checked requests ({warmer} warmer than predicted, "
        f"{len(wrong) - warmer} colder). Warmer: the server had more cached than this run's own "
        "requests left, which a shared cache does where earlier runs or other users sent the "
        "same prefix (CACHE=run gives the run its own cache salt and starts cold); colder: "
        "blocks the run left were gone (evicted) or the prediction is wrong."))
    if wrong:
        section.add(Bullets(tuple(
            f"request {r.request_id} ({r.regime} block {r.block}, {r.arm} {r.attempt}, "
            f"request {r.index}): measured {r.measured} of {r.prompt_tokens}, predicted "
            f"{r.predicted_low}-{r.predicted_high} ({r.disagreement})" for r in wrong[:LISTED])
            + ((f"... and {len(wrong) - LISTED} more (all in summary.json)",)
               if len(wrong) > LISTED else ())))
    if cache.unchecked:
        reasons: dict[str, int] = {}
        for _, _, why in cache.unchecked:
            reasons[why] = reasons.get(why, 0) + 1
        section.add(Paragraph("Not checked: " + "; ".join(f"{n} request(s): {why}"
                                                         for why, n in reasons.items())))
    return section


def policy_sections(analysis: RunAnalysis) -> list[Section]:
    figures = policy_figures(analysis)
    return [comparison_section(figures), cache_section(figures)]


def _paired(change: PairedChange) -> dict[str, Any]:
    return {"n": change.n, "median": change.arm_median, "clean_median": change.reference_median,
            "ratio_of_medians_pct": change.ratio_of_medians_pct,
            "paired_median_change_pct": change.median_pct, "ci_low_pct": change.ci_low_pct,
            "ci_high_pct": change.ci_high_pct}


def policy_summary(analysis: RunAnalysis) -> dict[str, Any]:
    """summary.json's `policies` and `cache_accounting` entries."""
    figures = policy_figures(analysis)
    policies = {regime: {"blocks": list(c.blocks), "arms": {r.arm: {
        "postfork_s": _paired(r.postfork), "input_tokens": _paired(r.input_tokens),
        "output_tokens": _paired(r.output_tokens), "cached_tokens": _paired(r.cached_tokens),
        "reasoning_tokens": _paired(r.reasoning_tokens), "success": asdict(r.success),
        "rewrite_s_median": r.rewrite_s_median, "scorer_s_median": r.scorer_s_median,
        "scorer_tokens_median": r.scorer_tokens_median, "devices": list(r.devices),
        "edits": dict(r.edits)} for r in c.rows}} for regime, c in figures.comparisons.items()}
    cache = figures.cache
    return {"policies": policies, "cache_accounting": {
        "block_size": cache.block_size, "block_source": cache.block_source,
        "per_replica": cache.per_replica,
        "arms": [asdict(a) for a in cache.arms],
        "checked": len(cache.requests), "unchecked": len(cache.unchecked),
        "disagreements": [asdict(r) for r in cache.disagreements]}}
