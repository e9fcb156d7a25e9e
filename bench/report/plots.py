"""The report's figures as PNG bytes. Pure rendering of a `RunAnalysis`; no pyplot state.

Figures are built on `matplotlib.figure.Figure` (Agg canvas), so nothing needs a display and
nothing leaks between calls. A figure whose data are absent returns None and the report says why.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from compaction_bench.bench.analysis.latency import regime_spans
from compaction_bench.bench.analysis.paired import POOLED, Comparison, RunAnalysis
from compaction_bench.bench.report.changes import median_text

SHORTER = "#1f77b4"   # blue: the arm finished sooner than clean in that block
LONGER = "#ff7f0e"    # orange: later or equal, as in the study's Figure 2
REGIME_COLORS = {"dedicated": "#2ca02c", "shared": "#9467bd", "overloaded": "#d62728"}
SOURCE_COLORS = {"clean": "#444444", "external": "#ff7f0e", "self": "#1f77b4",
                 "background": "#bbbbbb"}


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def _color(source: str, index: int) -> str:
    fallback = ["#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    return SOURCE_COLORS.get(source, fallback[index % len(fallback)])


def _label(comparison: Comparison) -> str:
    if comparison.name == POOLED:
        return "pooled\n(" + " + ".join(comparison.regimes) + ")"
    return comparison.name


def paired_dots(analysis: RunAnalysis, *, sensitivity: bool = False) -> bytes | None:
    """Each block's paired change per arm and regime; diamond = median, bar = 95% interval."""
    comparisons = analysis.sensitivity if sensitivity else analysis.primary
    groups = [c for c in comparisons.values() if c.n_blocks and c.arms]
    if len(analysis.regimes) == 1:
        groups = [c for c in groups if c.name != POOLED]
    if not groups:
        return None
    arms = [a for a in analysis.arms if a in groups[0].arms]
    rng = np.random.default_rng(0)  # jitter only; never touches a figure's value
    figure = Figure(figsize=(max(6.0, 1.2 * len(groups) * len(arms) + 1.5), 4.6))
    ax = figure.subplots()
    ticks, labels = [], []
    x = 0.0
    for g_index, comparison in enumerate(groups):
        if g_index:
            ax.axvline(x - 0.75, color="#dddddd", linewidth=1)
        for arm in arms:
            change = comparison.arms[arm].postfork
            values = np.asarray(change.changes_pct)
            jitter = rng.uniform(-0.18, 0.18, values.size)
            colors = [SHORTER if v < 0 else LONGER for v in values]
            ax.scatter(x + jitter, values, s=22, c=colors, alpha=0.75, linewidths=0, zorder=2)
            if change.ci_low_pct is not None and change.ci_high_pct is not None:
                # an end a censored block left unbounded runs past the data, with an arrow
                low, high = change.ci_low_pct, change.ci_high_pct
                reach = max(1.0, 0.1 * float(np.ptp(values))) if values.size else 1.0
                shown_low = low if np.isfinite(low) else float(values.min()) - reach
                shown_high = high if np.isfinite(high) else float(values.max()) + reach
                ax.vlines(x + 0.32, shown_low, shown_high, color="black", linewidth=2, zorder=3)
                for end, shown, marker in ((low, shown_low, "v"), (high, shown_high, "^")):
                    if not np.isfinite(end):
                        ax.scatter([x + 0.32], [shown], marker=marker, s=40, color="black",
                                   zorder=3)
            if change.median_pct is not None:
                ax.scatter([x + 0.32], [change.median_pct], marker="D", s=46, color="black",
                           zorder=4)
                note = median_text(change, 1).replace(" (", "\n(", 1)
                if change.ci_low_pct is None:
                    note += "\nno CI"
                ax.annotate(note, (x + 0.46, change.median_pct), fontsize=8, va="center",
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                                  "alpha": 0.8})
            ticks.append(x)
            labels.append(f"{arm}\nn={change.n}")
            x += 1.0
        ax.text(x - 1.0 - (len(arms) - 1) / 2, 1.02, _label(comparison), ha="center",
                va="bottom", transform=ax.get_xaxis_transform(), fontsize=9)
        x += 0.5
    ax.axhline(0, color="#888888", linewidth=1, zorder=1)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_xlim(-0.6, x - 0.1)
    ax.set_ylabel("paired change vs clean (%)")
    kind = "sensitivity (recovery runs substituted)" if sensitivity else "complete original blocks"
    ax.set_title(f"Postfork time per block, {kind}", fontsize=10, pad=34)
    ax.grid(axis="y", color="#eeeeee")
    ax.set_axisbelow(True)
    return _png(figure)


def _cdf(ax: Axes, values: Sequence[float], label: str, color: str) -> None:
    data = np.sort(np.asarray(values, dtype=float))
    ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", label=label,
            color=color, linewidth=1.4)


def latency_cdfs(analysis: RunAnalysis) -> bytes | None:
    """TTFT and request-time CDFs per regime, one line per source."""
    rows = [r for r in analysis.latency if r.ttft_values or r.request_time_values]
    if not rows:
        return None
    regimes = [g for g in analysis.regimes if any(r.regime == g for r in rows)]
    regimes += sorted({r.regime for r in rows} - set(regimes))
    figure = Figure(figsize=(4.2 * len(regimes), 6.2))
    axes = figure.subplots(2, len(regimes), squeeze=False)
    for col, regime in enumerate(regimes):
        for index, row in enumerate(r for r in rows if r.regime == regime):
            color = _color(row.source, index)
            if row.ttft_values:
                _cdf(axes[0][col], row.ttft_values, f"{row.source} (n={row.ttft.n})", color)
            if row.request_time_values:
                _cdf(axes[1][col], row.request_time_values,
                     f"{row.source} (n={row.request_time.n})", color)
        axes[0][col].set_title(regime, fontsize=10)
        for r, name in enumerate(("time to first token (s)", "request time (s)")):
            ax = axes[r][col]
            ax.set_xscale("log")
            ax.set_xlabel(name, fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.grid(color="#eeeeee")
            if ax.get_legend_handles_labels()[0]:  # no line where no request got that far
                ax.legend(fontsize=7, loc="lower right")
        axes[0][col].set_ylabel("share of requests")
        axes[1][col].set_ylabel("share of requests")
    figure.tight_layout()
    return _png(figure)


def server_timeseries(analysis: RunAnalysis) -> bytes | None:
    """Waiting/running requests and KV-cache usage over the run, block spans shaded by regime."""
    samples = sorted(analysis.records.metrics, key=lambda s: s.t_s)
    if not samples:
        return None
    figure = Figure(figsize=(10, 5.2))
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    t = [s.t_s for s in samples]
    for name, field, color in (("waiting", "num_requests_waiting", "#d62728"),
                               ("running", "num_requests_running", "#1f77b4")):
        series = [getattr(s, field) for s in samples]
        points = [(a, b) for a, b in zip(t, series, strict=True) if b is not None]
        if points:
            top.plot(*zip(*points, strict=True), label=f"requests {name}", color=color,
                     linewidth=1.2)
    kv = [(a, 100 * s.kv_cache_usage) for a, s in zip(t, samples, strict=True)
          if s.kv_cache_usage is not None]
    if kv:
        bottom.plot(*zip(*kv, strict=True), color="#2ca02c", linewidth=1.2)
    spans = regime_spans(analysis.records)
    for regime, items in spans.items():
        for i, (start, end) in enumerate(items):
            for ax in (top, bottom):
                ax.axvspan(start, end, color=REGIME_COLORS.get(regime, "#999999"), alpha=0.12,
                           label=regime if (ax is top and i == 0) else None)
    for block in analysis.records.blocks:
        if block.started_s is not None:
            top.annotate(str(block.block), (block.started_s, 1.0), fontsize=7, va="bottom",
                         xycoords=("data", "axes fraction"), color="#555555")
    top.set_ylabel("requests")
    top.legend(fontsize=8, loc="upper left", ncols=5)
    top.grid(color="#eeeeee")
    top.set_title("Server queue and KV-cache usage (shaded: blocks, numbered)", fontsize=10,
                  pad=14)
    bottom.set_ylabel("KV cache used (%)")
    bottom.set_ylim(0, 100)
    bottom.set_xlabel("run time (s)")
    bottom.grid(color="#eeeeee")
    figure.tight_layout()
    return _png(figure)


def cache_rates(analysis: RunAnalysis) -> bytes | None:
    """Prefix-cache hit rate per source in each regime, labelled with its request count."""
    rates = [c for c in analysis.cache if c.hit_rate is not None and c.source != "all"]
    if not rates:
        return None
    regimes = [g for g in analysis.regimes if any(c.regime == g for c in rates)]
    regimes += sorted({c.regime for c in rates} - set(regimes))
    sources = list(dict.fromkeys(c.source for c in rates))
    width = 0.8 / len(sources)
    figure = Figure(figsize=(max(5.0, 2.4 * len(regimes) + 1.5), 3.8))
    ax = figure.subplots()
    labelled: set[str] = set()
    for s_index, source in enumerate(sources):
        for r_index, regime in enumerate(regimes):
            found = next((c for c in rates if c.regime == regime and c.source == source), None)
            if found is None or found.hit_rate is None:
                continue
            x = r_index + (s_index - (len(sources) - 1) / 2) * width
            ax.bar(x, 100 * found.hit_rate, width * 0.9, color=_color(source, s_index),
                   label=None if source in labelled else source)
            labelled.add(source)
            label = f"{100 * found.hit_rate:.0f}%\nn={found.n_requests}"
            ax.text(x, 100 * found.hit_rate + 1, label, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(regimes)), regimes)
    ax.set_ylim(0, 118)
    ax.set_ylabel("cached / prompt tokens (%)")
    ax.set_title("Prefix-cache hit rate by source", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncols=len(sources))
    ax.grid(axis="y", color="#eeeeee")
    ax.set_axisbelow(True)
    return _png(figure)
