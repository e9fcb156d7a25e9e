"""plan.md: the plan for a reader, rendered from the same figures as plan.json."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compaction_bench.bench.run.config import LOLO_CONTINUATIONS
from compaction_bench.common.markdown import figure, table
from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.breakeven import BreakEven
from compaction_bench.plan.check import checked_under
from compaction_bench.plan.fleettables import fleet_markdown
from compaction_bench.plan.planner import Plan


def interval(values: Sequence[float | None] | None, digits: int = 2) -> str:
    if values is None:
        return ""
    low, high = values
    return f" [{figure(low, digits)}, {figure(high, digits) if high is not None else 'inf'}]"


def _digits(unit: str) -> int:
    return 5 if unit == "USD" else 2


def _scope(plan: Plan) -> list[str]:
    obs, config = plan.observations, plan.config
    engine = obs.engine
    lines = [f"# Capacity plan: {obs.run_id}", ""]
    lines += [f"> **{note}**" if "cannot reason" in note else f"> {note}"
              for note in plan.notes]
    lines.append("")
    if plan.sweep:
        levels = sorted({lv.level for c in plan.capacity.values() for lv in c.levels})
        n = sum(lv.n for c in plan.capacity.values() for lv in c.levels)
        lines.append(f"From a load-response sweep on {engine.device} (profile "
                     f"{engine.profile}, max_num_seqs {engine.max_num_seqs}, "
                     f"{engine.gpus_per_replica} GPU(s) per replica): levels "
                     f"{', '.join(map(str, levels))}, arms {', '.join(plan.capacity)}, {n} "
                     f"measured continuations; {_excluded(obs.excluded)}.")
    else:
        regimes = sorted({c.condition for c in obs.continuations})
        lines.append(f"From {len(obs.continuations)} continuations of {', '.join(regimes)} "
                     f"blocks (profile {engine.profile or 'unknown'}); "
                     f"{_excluded(obs.excluded)}.")
    target = (f"Target: SLO {config.target.label} on {TIME_BASIS[config.slo_time]}; fleet of "
              f"{config.agents} agents; " if plan.sweep else "")
    lines.append(f"{target}{100 * config.confidence:g}% intervals from {config.bootstrap} "
                 f"bootstrap resamples (seed {config.seed}). Schema: plan/SCHEMA.md.")
    return [*lines, ""]


TIME_BASIS = {
    "wall": "the wall time the agent sees (postfork time plus the rewriting it waits through "
            "inline; SLO_TIME=postfork for postfork time alone)",
    "postfork": "postfork time alone (it leaves out the rewriting an inline rewriter waits "
                "through; the default SLO_TIME=wall includes it)"}


def _excluded(excluded: dict[str, int]) -> str:
    if not excluded:
        return "nothing excluded"
    return "excluded: " + ", ".join(f"{v} {k}" for k, v in sorted(excluded.items()))


def _capacity(plan: Plan, document: dict[str, Any], check: dict[str, Any] | None
              ) -> list[str]:
    if not plan.sweep:
        return []
    first = next(iter(plan.capacity.values()))
    slo = plan.config.target
    target = f"{figure(first.slo_s, 1)} s" + (interval(first.slo_ci, 1) if slo.relative else "")
    lines = [f"## Agents per GPU (SLO {slo.label} = {target})", ""]
    if first.slo_reference is not None:
        lines += [f"The SLO is {slo.value:g}x {first.slo_reference.label(slo.quantile)}.", ""]
    engine = plan.observations.engine
    rows = []
    for arm, cap in plan.capacity.items():
        reach = cap.reach
        rows.append([arm, f"{_agents(cap.agents, cap.beyond)}{_agents_ci(cap.agents_ci, 0, reach)}"
                     f"{' (extrapolated)' if cap.extrapolated else ''}",
                     _per_gpu(cap), cap.binding,
                     f"{_unbounded(cap.n_slo, 1, reach if cap.n_slo_beyond else None)}"
                     f"{_agents_ci(cap.n_slo_ci, 1, reach)}"
                     f"{' (extrapolated)' if cap.n_slo_extrapolated else ''}",
                     f"{cap.kv_cap or '-'}{_lifted(cap, 'KV cache')}",
                     f"{cap.seq_cap or '-'} (duty {figure(cap.duty)})"
                     f"{_lifted(cap, 'max_num_seqs')}",
                     _fit_n(cap)])
    lines += table(["arm", f"agents per replica ({engine.gpus_per_replica} GPU)",
                    "agents per GPU", "binding limit", "N meeting the SLO", "KV-cache cap",
                    "sequence cap", "n"], rows)
    lines += ["", "A replica is the profile's GPUs serving one engine; agents per GPU = agents "
              f"per replica / {engine.gpus_per_replica}. Failed continuations count as SLO "
              "misses, and so do censored ones (stopped at the arm wall limit; counted among "
              "the failed) (plan/capacity.py). *unbounded*: the curve never reaches the SLO within "
              "what was measured and no engine limit is known, so no upper end exists. "
              "The plan extrapolates at most "
              f"{plan.config.extrapolation:g}x the largest measured level: past that, *> N* "
              "(beyond measured range), never a number. Intervals of N and agents include the "
              "curve's own error: past the largest level, each resample's curve is widened by "
              "the band of the top level's leave-one-level-out residual, growing with the "
              "distance (plan/curve.py `ModelError`).", "", _routing(plan, check)]
    lines += [f"- {arm}: N={lv.level} left out of the fit: "
              + ("every continuation failed" if lv.n == 0 else
                 f"{lv.failed}/{lv.n_all} failed{_censored_note(lv.censored)}, so its p"
                 f"{100 * slo.quantile:g} is a miss") + f" (n={lv.n_all})"
              for arm, cap in plan.capacity.items() for lv in cap.excluded]
    lines += [f"- {arm}: {line}" for arm, cap in plan.capacity.items()
              for line in (_against_measured(cap), _sampling_only(cap),
                           _few_continuations(cap)) if line]
    lines += [f"- {arm}: N={lv.level}: {lv.censored} of {lv.n_all} continuations were censored "
              f"at the arm wall limit (TimeExceeded after {figure(lv.censored_at_s, 0)} s): they "
              "count as misses, ranked above every finished one, since their true times are "
              "only known to be longer; raise ARM_WALL_S above the SLO to measure them"
              for arm, cap in plan.capacity.items()
              for lv in sorted([*cap.levels, *cap.excluded], key=lambda lv: lv.level)
              if lv.censored]
    source = engine.kv_source or "not recorded"
    lines += ["", f"KV pool: {figure(engine.kv_pool_tokens, 0)} tokens ({source}); resident "
              "tokens per agent = the SLO's quantile of each "
              "continuation's largest request; the sequence cap is max_num_seqs over the "
              "agent's duty at the lowest level (plan/capacity.py). Both caps are heuristics: "
              "neither binds below the largest level measured within the SLO (*lifted to*).", ""]
    lines += [f"## GPUs needed for {plan.config.agents} agents", ""]
    rows = []
    for arm, entry in document["arms"].items():
        need = entry["gpus_needed"] or {}
        if need.get("beyond_measured_range"):
            rows.append([arm, f"at most {need['gpus_ci'][1]} (capacity beyond measured range: "
                         f"> {need['beyond_measured_range']:g} agents per replica)", "-", "yes"])
            continue
        if need.get("unbounded"):
            rows.append([arm, f"at least {need['gpus_ci'][0]} (capacity unbounded)", "-", "-"])
            continue
        rows.append([arm, f"**{need.get('gpus') or '-'}**{interval(need.get('gpus_ci'), 0)}",
                     f"{need.get('replicas') or '-'} x {engine.gpus_per_replica}",
                     "yes" if need.get("extrapolated") else "no"])
    lines += table(["arm", "GPUs", "replicas x GPUs per replica", "extrapolated"], rows)
    lines += ["", "## Per task at the planned fleet", ""]
    rows = []
    for arm, f in plan.operating.items():
        if f is None:
            rows.append([arm, "-", "-", "-", "-", "-"])
            continue
        rows.append([arm, f"{figure(f.agents, 0)}", f"{figure(f.tasks_per_gpu_hour, 1)}"
                     f"{interval(f.tasks_per_gpu_hour_ci, 1)}",
                     f"{figure(f.gpu_s_per_task)}{interval(f.gpu_s_per_task_ci)}",
                     f"{figure(f.cost_per_task, _digits(f.cost_unit))} {f.cost_unit}",
                     figure(f.joules_per_task, 0)])
    lines += table(["arm", "agents per replica", "tasks per GPU-hour", "GPU-s per task",
                    "cost per task", "J per task"], rows)
    lines += [f"- {arm}: {f.note}" for arm, f in plan.operating.items() if f and f.note]
    return [*lines, ""]


def _lifted(cap: Any, name: str) -> str:
    """`; lifted to 5` where a measurement within the SLO outranked the engine cap."""
    lift = next((lift for lift in cap.lifted if lift.name == name), None)
    return "" if lift is None else f"; lifted to {lift.level} (N={lift.level} met the SLO)"


def _fit_n(cap: Any) -> str:
    """What the fit used (complete and failed continuations of its levels) and, apart, the
    levels left out of it (issue 29: the column did not say which it counted)."""
    used = (f"{sum(lv.n_all for lv in cap.levels)} in the fit "
            f"({sum(lv.failed for lv in cap.levels)} failed"
            f"{_censored_note(sum(lv.censored for lv in cap.levels))})")
    if not cap.excluded:
        return used
    return used + "; left out: " + ", ".join(
        f"N={lv.level} ({lv.n_all}, " + ("all failed)" if lv.n == 0 else f"{lv.failed} failed)")
        for lv in cap.excluded)


def _against_measured(cap: Any) -> str:
    """Where the plan's number differs from the largest level measured within the SLO (what a
    search of the same cells answers, bench/run/boundary.py), why."""
    if cap.agents is None or cap.held_level is None or cap.agents == cap.held_level:
        return ""
    above = (f"the smallest that missed it is N={cap.missed_level}" if cap.missed_level
             else "no measured level missed it")
    if cap.agents > cap.held_level:
        how = ("the plan's number lies between them, read off the fitted curve (a search "
               "would measure it)" if cap.missed_level else
               "the plan's number is the fitted curve past the measured levels")
    else:
        how = ("the fitted curve (isotonic, pooling a level above it whose quantile was "
               "lower) crosses the SLO below it")
    return (f"the largest level measured within the SLO is N={cap.held_level} and {above}: "
            f"{cap.agents} agents per replica differ from it because {how}")


# Below this many continuations at a level, the N interval's lower end misses the truth more
# often than its stated 2.5%: measured on synthetic sweeps of known truth (200 seeds each of a
# straight, a bending and a saturating curve, B = 400; tests/plan/test_shapes.py), the true N
# fell below it in 6.0-7.5% of seeds at 8 continuations per level, 3.0-3.5% at 16 and
# 2.5-3.0% at 32 (docs/measured-figures.md, "Coverage of the plan's intervals").
FEW_CONTINUATIONS = 16
FEW_MISS = "6-7.5%"


def _few_continuations(cap: Any) -> str:
    """Levels measured with fewer than FEW_CONTINUATIONS continuations: the interval's
    pessimistic end is known to be too optimistic there, by a measured amount."""
    fewest = min((lv.n_all for lv in cap.levels), default=None)
    if fewest is None or fewest >= FEW_CONTINUATIONS or cap.n_slo is None:
        return ""
    return (f"as few as {fewest} continuations at a level: the lower end of N's interval "
            f"is too high more often than its stated 2.5% (the true N fell below it in "
            f"{FEW_MISS} of synthetic sweeps at 8 per level, 3% at 16); plan with the lower "
            f"end, or measure {FEW_CONTINUATIONS} or more per level (SWEEP_MIN_CONTINUATIONS)")


def _sampling_only(cap: Any) -> str:
    """Fewer than 3 levels: no leave-one-level-out residual, so no model-error band."""
    if not cap.sampling_only:
        return ""
    return (f"only {len(cap.levels)} measured level(s): the interval of N holds sampling error "
            "only, no model error (no leave-one-level-out residual exists), and the curve's "
            "shape between and past them is unchecked; it is widened to the measured levels "
            "around the crossing (a monotone curve crosses between them), or to the "
            "extrapolation limit past the last; measure 3 levels or more")


def _censored_note(count: int) -> str:
    """`, 2 censored` where some misses were stopped at the arm wall limit."""
    return f", {count} censored" if count else ""


def _unbounded(value: float | None, digits: int = 0, reach: float | None = None) -> str:
    if value is not None and math.isinf(value):
        return "unbounded" if reach is None or math.isinf(reach) else f"> {reach:g}"
    return figure(value, digits)


def _agents(value: int | None, beyond: float | None = None) -> str:
    if value is None and beyond is not None:
        return f"**> {beyond:g}** (beyond measured range)"
    return "**unbounded**" if value is None else f"**{value}**"


def _per_gpu(cap: Any) -> str:
    if cap.beyond is not None:
        return f"> {cap.beyond / cap.gpus_per_replica:g}"
    return "unbounded" if cap.agents_per_gpu is None else figure(cap.agents_per_gpu, 1)


def _agents_ci(values: Sequence[float], digits: int = 0, reach: float | None = None) -> str:
    low, high = values
    return f" [{_unbounded(low, digits, reach)}, {_unbounded(high, digits, reach)}]"


def _routing(plan: Plan, check: dict[str, Any] | None) -> str:
    """What the GPU counts assume about a router in front of several replicas."""
    planned = {arm: 2 * cap.agents for arm, cap in plan.capacity.items() if cap.agents}
    return checked_under(check, planned)


def _levels(plan: Plan) -> list[str]:
    if not plan.sweep:
        return []
    quantile = plan.config.target.quantile
    q = f"p{100 * quantile:g}"
    basis = plan.config.slo_time
    other = "postfork" if basis == "wall" else "wall"
    lines = ["## Load response (measured levels)", "",
             f"The SLO bounds {basis} time; {other} time is shown beside it (wall = postfork + "
             "inline rewriting).", ""]
    rows = []
    for arm, cap in plan.capacity.items():
        figures = {f.condition: f for f in plan.level_figures[arm]}
        fitted = {lv.level: j for j, lv in enumerate(cap.levels)}
        for lv in sorted([*cap.levels, *cap.excluded], key=lambda lv: lv.level):
            f = figures[f"N={lv.level}"]
            j = fitted.get(lv.level)
            rows.append([arm, str(lv.level), str(lv.n),
                         f"{lv.failed}{_censored_note(lv.censored)}",
                         "missed (failures)" if j is None else
                         f"{figure(float(cap.quantiles[j]), 1)}{interval(cap.quantile_ci[j], 1)}",
                         "-" if j is None or not lv.n else figure(float(hd_quantile(
                             lv.times(other), lv.rank(quantile))), 1),
                         figure(lv.cycle_per_task_s, 1), figure(lv.duty),
                         f"{figure(f.tasks_per_gpu_hour, 0)}{interval(f.tasks_per_gpu_hour_ci, 0)}",
                         figure(f.joules_per_task, 0)])
    lines += table(["arm", "N", "n", "failed", f"{q} {basis} s (SLO)", f"{q} {other} s",
                    "cycle s per completed task",
                    "duty", "tasks per GPU-hour", "J per task"], rows)
    lines += ["", "### How far the curve reaches", ""]
    for arm, cap in plan.capacity.items():
        if not cap.lolo:
            lines.append(f"- {arm}: leave-one-level-out error needs 3 measured levels or more "
                         f"(this sweep has {len(cap.levels)})")
            continue
        lines.append(f"- {arm}: leave-one-level-out error of the fitted {q} (median absolute "
                     f"percentage error): {figure(cap.lolo_mape, 1)}% between measured levels, "
                     f"{figure(cap.lolo_mape_all, 1)}% with the end levels extrapolated "
                     f"({len(cap.lolo)} levels). {_lolo_coverage(cap)}")
    lines.append("- Every figure marked *extrapolated* lies beyond the measured levels, where "
                 "the curve is its last segment's straight line: measure those levels to rely "
                 "on it.")
    return [*lines, ""]


# continuations per level at which the LOLO figure was checked, the GPU sweep's default
LOLO_CHECKED = LOLO_CONTINUATIONS


def _lolo_coverage(cap: Any) -> str:
    """How many continuations per level the LOLO figure stands on, and what it needs: on
    synthetic truth it tracks the true held-out error within 1-2 points and reaches <= 6% for
    interior levels in 87-97% of seeds at 32 per level, but in only 68-80% at 8 (issue 29)."""
    counts = [lv.n_all for lv in cap.levels]
    said = (f"Continuations per level: {min(counts)}" + (f"-{max(counts)}" if max(counts)
                                                          != min(counts) else "") + ".")
    if min(counts) >= LOLO_CHECKED:
        return said
    return (f"{said} **LOLO at n < {LOLO_CHECKED} per level: interior error <= 6% in only "
            "~70-80% of seeds on synthetic truth (87-97% at 32); "
            f"SWEEP_MIN_CONTINUATIONS={LOLO_CHECKED} for a checked figure.**")


def _breakeven_rows(rows: list[BreakEven]) -> list[list[str]]:
    out = []
    for be in rows:
        if be.n_pairs == 0:
            continue
        uses = (f"{figure(be.uses)}{interval(be.uses_ci)}; first whole: {be.uses_whole or 'inf'}"
                if be.one_time is not None else
                f"{figure(be.uses_per_unit, 3)} uses per {be.unit} of T_R")
        out.append([be.arm, be.condition, str(be.n_pairs),
                    f"{figure(be.reference_mean)} / {figure(be.arm_mean)}",
                    f"{figure(be.saving, 3)}{interval(be.saving_ci, 3)}",
                    figure(be.p_no_saving),
                    figure(be.one_time, 3), uses,
                    f"{figure(be.serial)} / {figure(be.amortized.get(3))}"
                    if be.amortized else "-"])
    return out


def _notes(rows: list[BreakEven]) -> list[str]:
    """Each distinct note once, naming the rows it is about."""
    found: dict[str, list[str]] = {}
    for be in rows:
        for note in filter(None, be.note.split("; ")):
            found.setdefault(note, []).append(f"{be.arm} {be.condition}")
    return [f"- {note} ({', '.join(where) if len(where) < len(rows) else 'every row'})"
            for note, where in found.items()]


def _breakeven(plan: Plan) -> list[str]:
    if not plan.breakeven:
        return []
    lines = ["## Break-even uses of one compacted history", "",
             "n uses recover the one-time rewrite when n (T_C - T_K) > T_R (time) and "
             "n (C_C - C_K) > C_R (cost); the per-use saving is the mean of matched "
             "differences, T_K includes the rewriting during the continuation; headline "
             f"condition: **{plan.headline_condition}**.", ""]
    header = ["arm", "condition", "pairs", "clean / arm per use", "saving per use",
              "P(saving <= 0)", "one-time", "break-even uses", "serial / amortized over 3"]
    for quantity, unit in (("time", "s"), ("cost", plan.prices.unit)):
        rows = [be for be in plan.breakeven if be.quantity == quantity]
        lines += [f"### {quantity.capitalize()} ({unit})", ""]
        cells = _breakeven_rows(rows)
        lines += table(header, cells) if cells else ["No matched pairs could be priced."]
        lines += ["", *_notes(rows), ""]
    return lines


def _regimes(plan: Plan) -> list[str]:
    if not any(f.gpu_s_per_task is not None for f in plan.regime_figures):
        return []
    lines = ["## Per task in the regime blocks", ""]
    rows = [[f.arm, f.condition, str(f.n),
             f"{figure(f.gpu_s_per_task)}{interval(f.gpu_s_per_task_ci)}",
             f"{figure(f.cost_per_task, _digits(f.cost_unit))} {f.cost_unit}"
             if f.cost_per_task is not None else "-",
             figure(f.joules_per_task, 0), f.note] for f in plan.regime_figures]
    lines += table(["arm", "regime", "n", "GPU-s per task", "cost per task", "J per task",
                    "how"], rows)
    return [*lines, ""]


def _simulation(plan: Plan) -> list[str]:
    sim = plan.simulation
    if sim is None:
        return []
    q = f"p{100 * plan.config.target.quantile:g}"
    lines = ["## Simulated levels (device cost model)", "",
             f"A SimPy fleet simulator replays measured continuations against the cost model "
             f"`{sim.source}` ({sim.device}; its own held-out error: prefill "
             f"{figure(sim.heldout_mape.get('prefill'), 1)}%, decode "
             f"{figure(sim.heldout_mape.get('decode'), 1)}%).", ""]
    rows = []
    for arm, levels in sim.levels.items():
        moved = {lv.level: lv for lv in sim.transferred.get(arm, [])}
        for lv in levels:
            other = moved.get(lv.level)
            row = [arm, str(lv.level), figure(lv.predicted_s, 1), figure(lv.measured_s, 1),
                   figure(lv.ape_pct, 1), "no" if lv.in_measured_range else "yes"]
            rows.append([*row, figure(other.predicted_s, 1) if other else "-"]
                        if sim.transfer_device else row)
        lines.append(f"- {arm}: simulator error on the measured levels (median APE of the "
                     f"{q}): {figure(sim.mape(arm), 1)}%")
    header = ["arm", "N", f"simulated {q} s", f"measured {q} s", "APE %", "beyond measured"]
    if sim.transfer_device:
        header.append(f"on {sim.transfer_device} (unvalidated)")
    lines += ["", *table(header, rows)]
    lines += [f"- {note}" for note in sim.notes]
    return [*lines, ""]


def plan_markdown(plan: Plan, document: dict[str, Any], plots: Sequence[Path], *,
                  check: dict[str, Any] | None = None) -> str:
    """The whole plan.md; `check`: the run's plan_check.json where `make plan-check` ran."""
    lines = _scope(plan) + _capacity(plan, document, check)
    lines += fleet_markdown(plan.fleet, plan.config.agents, plan.config.target.quantile)
    lines += _levels(plan) + _regimes(plan)
    lines += _breakeven(plan) + _simulation(plan)
    lines += ["## What these records cannot tell", ""]
    lines += [f"- {line}" for line in plan.cannot] or ["- nothing left out"]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    return "\n".join(lines) + "\n"
