"""The plan's plots (PNG): the load-response curve, GPUs needed, break-even against uses.

Built on `matplotlib.figure.Figure` (Agg canvas): no display, no pyplot state. Every plot says
in its footnote how it was measured and its n; every value beyond the measured levels is drawn
dashed over a grey band labelled "extrapolated".
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from compaction_bench.common.files import write_bytes_atomic
from compaction_bench.plan.curve import MonotoneCurve
from compaction_bench.plan.planner import Plan

COLORS = {"clean": "#444444", "external": "#ff7f0e", "self": "#1f77b4", "placebo": "#2ca02c"}
OTHER = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#9467bd"]
GREY = "#e8e8e8"


def _save(figure: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    write_bytes_atomic(path, buffer.getvalue())
    return path


def color(arm: str, index: int) -> str:
    return COLORS.get(arm, OTHER[index % len(OTHER)])


def _footnote(figure: Figure, plan: Plan, text: str) -> None:
    engine = plan.observations.engine
    demo = (f"  Replay: the recorded turns of {', '.join(engine.replayed)} on {engine.profile}."
            if engine.replayed else "" if engine.reasons else (
                f"  {engine.profile}: the model cannot reason; this demonstrates the "
                "method, not the effect."))
    figure.text(0.01, -0.02, f"{text}{demo}", fontsize=7, ha="left", va="top", wrap=True)


def _extrapolated_band(ax: Axes, start: float, end: float) -> None:
    if end > start:
        ax.axvspan(start, end, color=GREY, zorder=0, label="extrapolated (beyond measured)")


def curve_plot(plan: Plan, path: Path) -> Path | None:
    """SLO quantile of postfork time against N per arm, the SLO, each arm's agents per GPU."""
    if not plan.capacity:
        return None
    slo = plan.config.target
    figure = Figure(figsize=(7.5, 4.8))
    ax = figure.subplots()
    top_measured = max(lv.level for c in plan.capacity.values() for lv in c.levels)
    # a list: with no arm bounded (every one unbounded, beyond the reach, or at 0 agents) the
    # old max(x, *()) was max(x) of a float and raised (issue 29)
    right = max([top_measured * 1.5,
                 *(c.agents + 1 for c in plan.capacity.values() if c.agents is not None),
                 *(c.beyond * 1.05 for c in plan.capacity.values() if c.beyond is not None)])
    _extrapolated_band(ax, top_measured, right)
    counts = []
    for i, (arm, cap) in enumerate(plan.capacity.items()):
        x = np.array([lv.level for lv in cap.levels], dtype=float)
        weights = [lv.n for lv in cap.levels]
        curve = MonotoneCurve(x, cap.quantiles, weights)
        lows = cap.quantiles - np.array([lo for lo, _ in cap.quantile_ci])
        highs = np.array([hi for _, hi in cap.quantile_ci]) - cap.quantiles
        c = color(arm, i)
        dodge = (i - (len(plan.capacity) - 1) / 2) * 0.04 * top_measured / 4  # bars side by side
        bars = [np.maximum(lows, 0), np.maximum(highs, 0)]
        ax.errorbar(x + dodge, cap.quantiles, yerr=bars, fmt="o", color=c, capsize=3,
                    label=f"{arm}: measured (n/level {min(weights)}-{max(weights)})")
        inside = np.linspace(x[0], x[-1], 200)
        ax.plot(inside, [curve(v) for v in inside], color=c, linewidth=1.5)
        outside = np.linspace(x[-1], right, 50)
        ax.plot(outside, [curve(v) for v in outside], color=c, linewidth=1.2, linestyle="--")
        if cap.agents:
            ax.axvline(cap.agents, color=c, linestyle=":", linewidth=1.2)
            ax.plot([cap.agents], [cap.slo_s], marker="v", color=c, markersize=9,
                    label=f"{arm}: {cap.agents} agents/GPU [{cap.agents_ci[0]}, "
                    f"{cap.agents_ci[1]}] ({cap.binding}"
                    f"{', extrapolated' if cap.extrapolated else ''})")
        elif cap.beyond is not None:  # a bound, never a number: the plan says "> reach"
            ax.axvline(cap.beyond, color=c, linestyle=":", linewidth=1.2)
            ax.plot([cap.beyond], [cap.slo_s], marker=">", color=c, markersize=9,
                    label=f"{arm}: > {cap.beyond:g} agents/GPU (beyond measured range)")
        elif cap.unbounded:
            ax.plot([], [], marker="^", color=c, linestyle="none",
                    label=f"{arm}: unbounded (the SLO is met at every level, no engine limit)")
        else:  # agents == 0: not even one agent meets the SLO
            ax.plot([], [], marker="x", color=c, linestyle="none",
                    label=f"{arm}: 0 agents/GPU (the SLO is missed by one agent alone)")
        counts.append(sum(weights))
    first = next(iter(plan.capacity.values()))
    ax.axhline(first.slo_s, color="#d62728", linewidth=1.2, label=f"SLO {slo.label}"
               f" = {first.slo_s:.1f} s")
    if slo.relative:
        ax.axhspan(*first.slo_ci, color="#d62728", alpha=0.08)
    ax.set_xlim(0, right)
    ax.set_xlabel("agents on one replica (N, closed loop)")
    ax.set_ylabel(f"p{100 * slo.quantile:g} postfork time (s)")
    ax.set_title(f"Load response: {plan.observations.run_id}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _footnote(figure, plan, f"Measured: make bench REGIME=sweep, {sum(counts)} measured "
              f"continuations; points = Harrell-Davis p{100 * slo.quantile:g} per level with "
              f"{100 * plan.config.confidence:g}% bootstrap intervals (B={plan.config.bootstrap}"
              "); lines: isotonic + PCHIP fit, dashed beyond the measured levels.")
    return _save(figure, path)


def gpus_plot(plan: Plan, path: Path) -> Path | None:
    """GPUs needed against fleet size, per arm, with the bootstrap interval."""
    if not plan.fleets:
        return None
    figure = Figure(figsize=(7.5, 4.5))
    ax = figure.subplots()
    for i, (arm, needs) in enumerate(plan.fleets.items()):
        rows = [n for n in needs if n.gpus is not None]
        gpus = [float(n.gpus or 0) for n in rows]
        if not rows:
            continue
        x = [n.agents for n in rows]
        c = color(arm, i)
        extra = " (extrapolated)" if plan.capacity[arm].extrapolated else ""
        ax.step(x, gpus, where="post", color=c, label=f"{arm}{extra}",
                linestyle="--" if extra else "-")
        low = [float(n.gpus_ci[0]) if n.gpus_ci[0] is not None else g for n, g in zip(
            rows, gpus, strict=True)]
        high = [float(n.gpus_ci[1]) if n.gpus_ci[1] is not None else np.nan for n in rows]
        ax.fill_between(x, low, high, step="post", color=c, alpha=0.15)
    ax.axvline(plan.config.agents, color="#999999", linestyle=":",
               label=f"AGENTS={plan.config.agents}")
    ax.set_xlabel("agents in the fleet")
    ax.set_ylabel("GPUs needed (replicas x GPUs per replica)")
    ax.set_title(f"GPUs needed under SLO {plan.config.target.label}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _footnote(figure, plan, f"From the agents per GPU of each arm ({plan.observations.run_id}); "
              f"bands: {100 * plan.config.confidence:g}% bootstrap intervals "
              f"(B={plan.config.bootstrap}).")
    return _save(figure, path)


def breakeven_plot(plan: Plan, path: Path) -> Path | None:
    """Net time saving after n uses (n x saving - T_R) per arm, at the headline condition."""
    rows = [be for be in plan.breakeven if be.quantity == "time" and be.curve
            and be.condition == plan.headline_condition]
    if not rows:
        return None
    figure = Figure(figsize=(7.5, 4.5))
    ax = figure.subplots()
    arms = plan.observations.arms
    for be in rows:
        c = color(be.arm, arms.index(be.arm) if be.arm in arms else 0)
        uses = [k for k, *_ in be.curve]
        ax.plot(uses, [v for _, v, _, _ in be.curve], color=c, marker="o", markersize=3,
                label=f"{be.arm}: saving {be.saving or 0:+.2f} s/use, P(no saving) "
                f"{'-' if be.p_no_saving is None else f'{be.p_no_saving:.2f}'}, "
                f"n={be.n_pairs} pairs")
        ax.fill_between(uses, [lo for *_, lo, _ in be.curve], [hi for *_, hi in be.curve],
                        color=c, alpha=0.15)
    ax.axhline(0, color="#d62728", linewidth=1)
    ax.set_xlabel("uses of one compacted history (n)")
    ax.set_ylabel("net time saved: n (T_C - T_K) - T_R (s)")
    ax.set_title(f"Break-even against uses ({plan.headline_condition})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _footnote(figure, plan, "Above zero the rewrite has paid for itself. Per-use saving = mean "
              "of matched differences; T_R = the arm file's fork rewrite; bands: "
              f"{100 * plan.config.confidence:g}% bootstrap over pairs "
              f"(B={plan.config.bootstrap}).")
    return _save(figure, path)


def draw_plots(plan: Plan, folder: Path) -> list[Path]:
    """Every plot the plan's data support, as PNG files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    made = [curve_plot(plan, folder / "plan_curve.png"),
            gpus_plot(plan, folder / "plan_gpus.png"),
            breakeven_plot(plan, folder / "plan_breakeven.png")]
    return [p for p in made if p is not None]
