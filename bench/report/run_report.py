"""The report of one run folder: report.md, report.html (plots embedded), plots/*.png and
summary.json, all rendered from one `RunAnalysis`.

Every figure states its n; an arm with fewer than MIN_BLOCKS_FOR_MEDIAN_INTERVAL paired blocks
says so instead of showing an interval.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.bench.analysis.overhead import harness_overhead, overhead_lines
from compaction_bench.bench.analysis.paired import (
    POOLED,
    ArmComparison,
    BlockStatus,
    Comparison,
    RunAnalysis,
    analyze,
)
from compaction_bench.bench.analysis.repeats import CONDITIONAL
from compaction_bench.bench.analysis.replay import analyze_replay, identical_arms
from compaction_bench.bench.analysis.serving import requests_table
from compaction_bench.bench.analysis.stats import (
    MIN_BLOCKS_FOR_MEDIAN_INTERVAL,
    PairedChange,
    median_rank,
)
from compaction_bench.bench.analysis.study import import_study
from compaction_bench.bench.analysis.summary import build_summary
from compaction_bench.bench.report import plots
from compaction_bench.bench.report.changes import (
    CLEAN_CONTEXT,
    change_cell,
    medians_text,
)
from compaction_bench.bench.report.compaction_cost import compaction_cost_section
from compaction_bench.bench.report.document import (
    Bullets,
    Document,
    Image,
    Paragraph,
    Section,
    Table,
    to_html,
    to_markdown,
)
from compaction_bench.bench.report.host_report import host_line, host_sections, host_summary
from compaction_bench.bench.report.policy_report import policy_sections, policy_summary
from compaction_bench.bench.report.repeats import repeat_sections, repeat_summary
from compaction_bench.bench.report.replay_sections import replay_sections
from compaction_bench.bench.report.replicas import replica_sections
from compaction_bench.bench.report.sections import (
    remote_summary,
    serving_sections,
    trust_sections,
)
from compaction_bench.bench.report.specdecode import spec_sections
from compaction_bench.bench.runfolder import REFERENCE_ARM, RunRecords, read_run
from compaction_bench.common.files import write_bytes_atomic, write_json_atomic, write_text_atomic
from compaction_bench.common.markdown import MISSING, percent
from compaction_bench.common.resampling import CONFIDENCE
from compaction_bench.histories.policies.registry import RECORDED_ARM

Metric = Callable[[ArmComparison], PairedChange]
POSTFORK: Metric = lambda a: a.postfork  # noqa: E731
WITH_REWRITE: Metric = lambda a: a.with_rewrite  # noqa: E731
WITH_FORK_REWRITE: Metric = lambda a: a.with_fork_rewrite  # noqa: E731


def _factors(manifest: Mapping[str, object]) -> list[str]:
    """The run's recorded factors, where its manifest states them."""
    config = manifest.get("config")
    if not isinstance(config, dict):
        return []
    out = []
    for key, label in (("source", "continuations"), ("side_by_side", "arms side by side"),
                       ("seeds", "sampling seeds"), ("cache", "prefix cache"),
                       ("protocol", "protocol check"), ("rewrite_cache", "rewrite cache")):
        if key in config:
            out.append(f"{label}: {config[key] if config[key] is not None else 'default'}")
    if config.get("fast_start") is True:
        out.append("server: started uncompiled (FAST_START=1, --optimization-level 0); its steps "
                   "are slower than a compiled server's (18-28% on cpu-tiny): compare these "
                   "times only with runs made the same way")
    probe = manifest.get("service_probe")
    if isinstance(probe, dict):
        out.append(f"measured service time (background pacing): TTFT "
                   f"{probe.get('ttft_s', 0):.3f} s, {probe.get('tokens_per_s', 0):.1f} tokens/s")
    return out


def _source_line(manifest: Mapping[str, object]) -> str:
    """What the arms continued: a task with live agents, or replayed records."""
    config = manifest.get("config")
    replay = manifest.get("replay")
    if isinstance(config, dict) and config.get("source") == "replay" and isinstance(replay, dict):
        records = replay.get("records") or []
        return (f"replayed records ({len(records)}): "
                + ", ".join(map(str, records)) if isinstance(records, list) else "replay")
    return f"task: {manifest.get('task', 'not stated (manifest.json missing or silent)')}"


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    summary: Path
    plots: tuple[Path, ...]
    table: Path | None = None  # requests.parquet, where the run recorded requests


def pct(value: float | None) -> str:
    return percent(value, 2, sign=True)


def interval_line(analysis: RunAnalysis) -> str:
    """How the paired intervals were computed, with the exact coverage at each n of this run."""
    sizes = "; ".join(
        f"n={n}: [x({median_rank(n)}), x({n - (median_rank(n) or 0) + 1})] covers "
        f"{1 - f.exact:.1%}" if f.reported else f"n={n}: none ([min, max] would cover "
        f"{1 - f.exact:.1%})" for n, f in analysis.noise.false_positive.items())
    return (f"intervals: distribution-free interval of the median paired change (order "
            f"statistics of the blocks' changes, the narrowest with exact coverage >= "
            f"{CONFIDENCE:.0%}; none below {MIN_BLOCKS_FOR_MEDIAN_INTERVAL} blocks)"
            + (f": {sizes}" if sizes else ""))


def _seconds(value: float | None, n: int) -> str:
    return MISSING if value is None else f"{value:.1f} s (n={n})"


def _label(comparison: Comparison) -> str:
    if comparison.name == POOLED:
        return f"pooled ({' + '.join(comparison.regimes)})"
    return comparison.name


IDENTICAL = "identical to clean: nothing was compacted"
# the `recorded` arm of a log imported with its compaction, against clean with it undone; both
# continue with the log's turns after it, so its change is the history's alone
AGENTS_OWN = "the agent's own compaction, against clean with it undone; the log's turns after it"


def arm_label(analysis: RunAnalysis, arm: str) -> str:
    """An arm's name in a table, marked where its first request equalled clean's in every
    block: its 'change' is then noise, and every table says so."""
    if arm in identical_arms(analysis.records.arms):
        return f"{arm} ({IDENTICAL})"
    return f"{arm} ({AGENTS_OWN})" if arm == RECORDED_ARM else arm


def comparison_table(
    analysis: RunAnalysis, comparisons: Mapping[str, Comparison], metric: Metric, caption: str
) -> Table:
    """Table-12 style: one row per regime (and pooled), one change column per arm."""
    others = [a for a in analysis.arms if a != REFERENCE_ARM]
    header = ("Regime", "Blocks", CLEAN_CONTEXT,
              *(f"{arm_label(analysis, a)}: change [95% CI]" for a in others),
              *(f"{a}: faster" for a in others))
    rows = []
    for comparison in comparisons.values():
        if comparison.name == POOLED and len(analysis.regimes) == 1:
            continue
        changes = [metric(comparison.arms[a]) for a in others if a in comparison.arms]
        vary = len({c.n for c in changes}) > 1 or any(c.n != comparison.n_blocks for c in changes)
        clean = next((c.reference_median for c in changes if c.n), None)
        clean_n = changes[0].n if changes else comparison.n_blocks
        if metric is POSTFORK:
            clean, clean_n = comparison.clean_median_s, comparison.n_blocks
        rows.append((
            _label(comparison),
            str(comparison.n_blocks),
            _seconds(clean, clean_n),
            *(change_cell(c, with_n=vary) for c in changes),
            *(f"{c.n_faster}/{c.n}" for c in changes),
        ))
    return Table(header, tuple(rows), caption)


def _block_row(analysis: RunAnalysis, block: BlockStatus) -> tuple[str, ...]:
    cells = []
    records = [r for r in analysis.records.arms if (r.regime, r.block) == block.key]
    # Changes are shown only against a complete original clean arm of the same block.
    clean = next((r for r in records if r.arm == REFERENCE_ARM and r.attempt == "original"
                  and r.complete), None)
    for arm in analysis.arms:
        own = [r for r in records if r.arm == arm]
        parts = []
        for r in own:
            # a time stopped at the wall limit is a lower bound of the true one
            text = f"≥ {r.postfork_s:.2f} s (censored)" if r.censored else f"{r.postfork_s:.2f} s"
            if r.attempt != "original":
                text = f"{r.attempt}: {text}"
            if not r.complete:
                text += f" {r.status}"
            elif arm != REFERENCE_ARM and clean is not None and clean.postfork_s:
                change = pct(100 * (r.postfork_s - clean.postfork_s) / clean.postfork_s)
                bound = {(True, False): "≥ ", (False, True): "≤ ",
                         (True, True): "both censored: observed "}.get(
                    (r.censored, clean.censored), "")
                text += f" ({bound}{change})"
            parts.append(text)
        cells.append("\n".join(parts) or "missing")
    if block.complete:
        status = "complete"
    elif block.sensitivity:
        status = "sensitivity only (recovery: " + ", ".join(block.substituted) + ")"
    else:
        status = "not used"
    # each original attempt's base sampling seed: the placebo's must differ from clean's (an
    # A/A), and under SEEDS=common the other arms share clean's
    seeds = ", ".join(f"{r.arm} {r.seed}" for r in sorted(
        (r for r in records if r.attempt == "original" and r.seed is not None),
        key=lambda r: analysis.arms.index(r.arm) if r.arm in analysis.arms else 99)
    ) or "not recorded"
    return (block.regime, str(block.block), ", ".join(block.order) or "not recorded", *cells,
            seeds, status)


def _token_cell(change: PairedChange) -> str:
    """Both medians side by side invite their ratio: it is printed, named, beside the median of
    paired changes, which is the figure compared (the two can differ)."""
    if change.n == 0:
        return "not recorded (n=0)"
    return (f"{medians_text(change)}; median of paired changes "
            + change_cell(change, with_n=True))


def build_document(analysis: RunAnalysis, images: Mapping[str, bytes | None]) -> Document:
    """The whole report as a document; `images` maps plot names to PNG bytes (None: no data)."""
    records = analysis.records
    manifest = records.manifest
    run = Section("Run").add(Bullets((
        f"run id: {analysis.run_id}",
        *filter(None, [host_line(analysis)]),  # issue 30: contended blocks, at the top
        _source_line(manifest),
        f"profile: {manifest.get('profile', 'not stated')}",
        f"arms: {', '.join(analysis.arms) or 'none'} (reference: {REFERENCE_ARM})",
        f"regimes: {', '.join(analysis.regimes) or 'none'}",
        f"records read: {len(records.arms)} arm attempts, {len(records.blocks)} blocks, "
        f"{len(records.requests)} requests, {len(records.metrics)} /metrics samples",
        *([f"notes: {manifest['notes']}"] if isinstance(manifest.get("notes"), str) else []),
        *_factors(manifest),
        interval_line(analysis),
        CONDITIONAL,
        *overhead_lines(harness_overhead(records)),
    )))
    primary = Section("Postfork marginal time: complete original blocks").add(
        Paragraph("Paired change = 100 x (arm - clean) / clean within a block; the table shows "
                  "its median over blocks. A block is complete when every arm's original "
                  "attempt passed the protocol check. 'faster' counts blocks where the arm "
                  "finished sooner than clean. The clean median is context: the change is not "
                  "taken against it (a ratio of medians can differ from the median of paired "
                  "changes). A block stopped at the wall limit (censored) gives a bound, not a "
                  "value: where such blocks can move the median, the table prints the bound "
                  "(≥ x, ≤ x) with their count, and an interval end they reach is unbounded."),
        comparison_table(analysis, analysis.primary, POSTFORK, "Primary analysis"),
    )
    if not any(c.n_blocks for c in analysis.primary.values()):
        primary.add(Paragraph("No complete blocks: nothing to compare. The section 'Failures "
                              "and unusable blocks' says why."))
    replay = analyze_replay(analysis)
    if images.get("paired_dots"):
        primary.add(Image("paired_dots.png", images["paired_dots"] or b"",
                          "Each point is one block's paired change; diamond: median, bar: 95% "
                          "interval (an arrow: an end censored blocks left unbounded). Blue: "
                          "faster than clean; orange: slower or equal."))
    substitutions = [f"{b.regime} block {b.block}: {arm} replaced by its recovery run"
                     for b in analysis.blocks if b.sensitivity for arm in b.substituted]
    sensitivity = Section("Sensitivity: failed original arms replaced by recovery runs")
    if substitutions:
        sensitivity.add(
            Paragraph("Reported beside the primary analysis, never mixed into it. Recovery runs "
                      "ran later than their block, so these rows are not contemporaneous."),
            Bullets(tuple(substitutions)),
            comparison_table(analysis, analysis.sensitivity, POSTFORK, "Sensitivity analysis"),
        )
        if images.get("paired_dots_sensitivity"):
            sensitivity.add(Image("paired_dots_sensitivity.png",
                                  images["paired_dots_sensitivity"] or b"",
                                  "As above, with recovery runs substituted for failed arms."))
    else:
        sensitivity.add(Paragraph("No failed original arm has a complete recovery run, so the "
                                  "sensitivity analysis equals the primary one."))
    failures = Section("Failures and unusable blocks")
    if analysis.failures:
        failures.add(Table(("Regime", "Arm", "Attempt", "Reason", "Count"), tuple(
            (f.regime, f.arm, f.attempt, f.reason, str(f.count)) for f in analysis.failures)))
    else:
        failures.add(Paragraph("No failed arm attempts."))
    unusable = [f"{b.regime} block {b.block}: {'; '.join(b.reasons)}"
                + (" (used in the sensitivity analysis)" if b.sensitivity else "")
                for b in analysis.blocks if not b.complete]
    failures.add(Paragraph(f"Blocks not used in the primary analysis: {len(unusable)} of "
                           f"{len(analysis.blocks)}."))
    if unusable:
        failures.add(Bullets(tuple(unusable)))
    if records.issues:
        failures.add(Paragraph("Unreadable files and lines (skipped):"),
                     Bullets(tuple(f"{i.where()}: {i.reason}" for i in records.issues)))
    rewrite = Section("Postfork time with rewrite time added")
    if any(a.with_rewrite.n for c in analysis.primary.values() for a in c.arms.values()):
        rewrite.add(
            Paragraph("postfork_s + rewrite_s per arm (rewriting during the continuation, each "
                      "attempt paying its own unless the run reused a rewrite cache); a block "
                      "enters only where both arms recorded a rewrite time (clean records 0)."),
            comparison_table(analysis, analysis.primary, WITH_REWRITE, "Rewrite-inclusive time"),
            Paragraph("Serial rewrite-inclusive time, the study's T_K + T_R: the above plus the "
                      "one-time compaction of the fork prefix recorded in the arm's file."),
            comparison_table(analysis, analysis.primary, WITH_FORK_REWRITE,
                             "Rewrite-inclusive time with the fork prefix's compaction"),
        )
    else:
        rewrite.add(Paragraph("No block recorded rewrite times for both clean and an arm "
                              "(n=0), so rewrite-inclusive time is not available."))
    tokens = Section("Tokens per continuation").add(Table(
        ("Regime", "Arm", "reasoning tokens: medians, median of paired changes [95% CI]",
         "completion tokens: medians, median of paired changes [95% CI]",
         "history tokens: medians, median of paired changes [95% CI]"),
        tuple((_label(c), arm_label(analysis, a.arm), _token_cell(a.reasoning_tokens),
               _token_cell(a.completion_tokens), _token_cell(a.history_tokens))
              for c in analysis.primary.values()
              if not (c.name == POOLED and len(analysis.regimes) == 1)
              for a in c.arms.values()),
        "Complete original blocks. The ratio of medians is context beside the two medians; "
        "the compared figure is the median of paired changes. Reasoning and completion "
        "tokens: blocks where both arms "
        "recorded the value and took the same number of postfork turns (the study's "
        "equal-turn pairs); history tokens: the first postfork request's prompt. n counts the "
        "blocks used. Reasoning tokens are the server's usage figure, or for tagged-visible "
        "reasoning the thoughts counted with the server's tokenizer; for replay, the recorded "
        "turns' own (the served model only fills the forced lengths)."))
    per_block = Section("Per-block records").add(Table(
        ("Regime", "Block", "Start order",
         *(f"{arm_label(analysis, a)} postfork" for a in analysis.arms), "Sampling seeds",
         "Use"),
        tuple(_block_row(analysis, b) for b in analysis.blocks),
        "Changes in parentheses are against the same block's clean arm; a time stopped at the "
        "wall limit (censored) is a lower bound, so its change is one too (≥), clean's makes "
        "it an upper bound (≤). Sampling seeds: each "
        "arm's base seed in the block (request k sends seed + k)."))
    return Document(f"Run report: {analysis.run_id}", (
        run, primary, *host_sections(analysis, lambda comparisons, caption: comparison_table(
            analysis, comparisons, POSTFORK, caption)),
        *repeat_sections(analysis),
        *(replay_sections(replay, analysis.arms) if replay else ()),
        sensitivity, failures, rewrite, *compaction_cost_section(analysis), tokens,
        *policy_sections(analysis),
        per_block, *trust_sections(analysis), *serving_sections(analysis, images),
        *replica_sections(analysis), *spec_sections(analysis),
    ))


def render(analysis: RunAnalysis) -> Document:
    images = {
        "paired_dots": plots.paired_dots(analysis),
        "paired_dots_sensitivity": plots.paired_dots(analysis, sensitivity=True),
        "latency_cdfs": plots.latency_cdfs(analysis),
        "cache_rates": plots.cache_rates(analysis),
        "server_timeseries": plots.server_timeseries(analysis),
    }
    return build_document(analysis, images)


def write_report(run_dir: Path, *, seed: int = 0) -> ReportFiles:
    """Analyse a run folder and write report.md, report.html, plots/ and summary.json into it."""
    return write_analysis(analyze(read_run(run_dir), seed=seed), run_dir)


def write_analysis(analysis: RunAnalysis, out_dir: Path) -> ReportFiles:
    document = render(analysis)
    written = []
    for image in document.images():
        path = out_dir / "plots" / image.name
        write_bytes_atomic(path, image.png)
        written.append(path)
    table = None
    if analysis.records.requests:
        table = out_dir / "requests.parquet"
        buffer = io.BytesIO()
        requests_table(analysis.records).to_parquet(buffer, index=False)
        write_bytes_atomic(table, buffer.getvalue())
    files = ReportFiles(out_dir / "report.md", out_dir / "report.html", out_dir / "summary.json",
                        tuple(written), table)
    write_text_atomic(files.markdown, to_markdown(document))
    write_text_atomic(files.html, to_html(document))
    write_json_atomic(files.summary, {**build_summary(analysis), **policy_summary(analysis),
                                      **remote_summary(analysis), **host_summary(analysis),
                                      **repeat_summary(analysis)})
    return files


def report_study(source: Path | None = None, out: Path | None = None, *,
                 seed: int = 0) -> ReportFiles:
    """Import the study's B300 records (default: the shipped `data/study/b300_blocks.json`) as a
    run folder at `out` (default: results/study-b300) and write its report there."""
    return write_report(import_study(source, out), seed=seed)


def analyze_folder(run_dir: Path, *, seed: int = 0) -> tuple[RunRecords, RunAnalysis]:
    records = read_run(run_dir)
    return records, analyze(records, seed=seed)
