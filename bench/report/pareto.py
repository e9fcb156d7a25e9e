"""The policy comparison's figure: postfork time against tokens per continuation, one marker per
arm (its medians over the complete blocks), coloured by task success, with every block's
continuation behind it and the arms no other arm beats in both time and tokens joined up.
Pure rendering (Agg `Figure`, no pyplot state); None when there is nothing to draw."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from compaction_bench.bench.analysis.tradeoffs import Continuation, PolicyComparison
from compaction_bench.bench.runfolder import arm_sort_key

ALL_PASS, SOME_PASS, NONE_PASS, UNKNOWN = "#2ca02c", "#ff7f0e", "#d62728", "#888888"


def _success_color(values: list[bool | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return UNKNOWN
    share = sum(known) / len(known)
    return ALL_PASS if share == 1 else NONE_PASS if share == 0 else SOME_PASS


def _frontier(points: dict[str, tuple[float, float]]) -> list[str]:
    """Arms no other arm beats in both coordinates (lower tokens and lower time), by tokens."""
    keep = [a for a, (x, y) in points.items()
            if not any((x2 <= x and y2 <= y) and (x2, y2) != (x, y)
                       for b, (x2, y2) in points.items() if b != a)]
    return sorted(keep, key=lambda a: points[a][0])


def _label(arm: str, runs: list[Continuation]) -> str:
    return f"{arm} ({sum(bool(c.success) for c in runs)}/{len(runs)} passed)"


def _label_offsets(points: dict[str, tuple[float, float]], widths: dict[str, int]
                   ) -> dict[str, int]:
    """Vertical label offsets (points) so that labels that would overlap (arms drawn close
    together, or on one spot where their histories stayed identical) stack at least a line
    apart. `points`: each marker's position on the page in points; a label starts 6 points to
    the right of its marker and is about 4.6 points per character of 8-point text."""
    placed: list[tuple[float, float, float]] = []  # (left, right, label height), points
    out = {}
    for arm, (x, y) in sorted(points.items(), key=lambda kv: (kv[1][1], kv[1][0])):
        left, right = x + 6, x + 6 + 4.6 * widths[arm]
        label = y + 4
        for other_left, other_right, other_label in sorted(placed, key=lambda p: p[2]):
            if left < other_right and other_left < right and abs(label - other_label) < 11:
                label = other_label + 11
        out[arm] = round(label - y)
        placed.append((left, right, label))
    return out


def pareto_figure(comparisons: dict[str, PolicyComparison]) -> bytes | None:
    """One panel per regime with complete blocks (see the module docstring)."""
    panels = [c for c in comparisons.values()
              if any(x.total_tokens is not None for cs in c.continuations.values() for x in cs)]
    if not panels:
        return None
    figure = Figure(figsize=(6.4 * len(panels), 4.8))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, comparison in zip(axes, panels, strict=True):
        medians: dict[str, tuple[float, float]] = {}
        for arm in sorted(comparison.continuations, key=arm_sort_key):
            runs: tuple[Continuation, ...] = comparison.continuations[arm]
            drawn = [c for c in runs if c.total_tokens is not None]
            if not drawn:
                continue
            for c in drawn:
                # "x" is drawn by its edge: a zero line width would hide every failure
                ax.scatter([c.total_tokens], [c.postfork_s], s=18, alpha=0.5,
                           linewidths=0 if c.success else 1.0,
                           marker="o" if c.success else "x",
                           color=_success_color([c.success]), zorder=2)
            x = float(np.median([float(c.total_tokens or 0) for c in drawn]))
            y = float(np.median([c.postfork_s for c in drawn]))
            medians[arm] = (x, y)
            ax.scatter([x], [y], s=70, marker="D", color=_success_color([c.success for c in
                                                                         drawn]),
                       edgecolors="black", linewidths=0.8, zorder=4)
        texts = {arm: _label(arm, [c for c in comparison.continuations[arm]
                                   if c.total_tokens is not None]) for arm in medians}
        ax.autoscale_view()  # the limits the markers get, so that page positions are final
        scale = 72.0 / figure.dpi  # display pixels to points
        page = {arm: (float(px) * scale, float(py) * scale)
                for arm, (px, py) in ((a, ax.transData.transform(xy))
                                      for a, xy in medians.items())}
        labels = _label_offsets(page, {arm: len(t) for arm, t in texts.items()})
        for arm, (x, y) in medians.items():
            ax.annotate(texts[arm], (x, y), textcoords="offset points",
                        xytext=(6, labels[arm]), fontsize=8)
        front = _frontier(medians)
        if len(front) > 1:
            ax.plot([medians[a][0] for a in front], [medians[a][1] for a in front],
                    linestyle="--", color="#555555", linewidth=1, zorder=3)
        ax.set_xlabel("tokens per continuation (input + output, all postfork requests)")
        ax.set_ylabel("postfork marginal time (s)")
        ax.set_title(f"{comparison.regime}: medians over {len(comparison.blocks)} complete "
                     "block(s)", fontsize=10)
        ax.grid(color="#eeeeee")
        ax.set_axisbelow(True)
    handles = [Line2D([], [], marker="D", linestyle="", color=c, markeredgecolor="black",
                      label=label)
               for c, label in ((ALL_PASS, "validation passed in every block"),
                                (SOME_PASS, "in some blocks"), (NONE_PASS, "in none"))]
    handles.append(Line2D([], [], linestyle="--", color="#555555",
                          label="no arm lower in both"))
    axes[0].legend(handles=handles, fontsize=7, loc="best")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()
