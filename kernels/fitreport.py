"""Text renderings of fits: the summary `make kernels` prints, and `kernels.cli check`'s
per-level table of measured vs predicted times with held-out errors."""

from __future__ import annotations

from typing import Any

from compaction_bench.common.markdown import number, percent
from compaction_bench.kernels.costmodel import CostModel


def _pct(value: float | None) -> str:
    return percent(value, 1)


def _ms(value: float | None) -> str:
    return number(None if value is None else value * 1e3, 2)


def _coefficients(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items())


def fit_lines(fits: dict[str, Any]) -> list[str]:
    """Per phase: every candidate's coefficients and held-out error, and the chosen one."""
    lines = []
    for phase, fit in fits.items():
        lines.append(f"[fit] {phase}: chosen {fit['chosen']} ({fit['selection']}); repeats of "
                     f"one level spread {_pct(fit.get('repeat_spread_median_pct'))} "
                     "(median of (max-min)/median)")
        for name, candidate in fit["candidates"].items():
            if "unavailable" in candidate:
                lines.append(f"[fit]   {name:<9} unavailable: {candidate['unavailable']}")
                continue
            held = candidate["heldout"]
            lines.append(
                f"[fit]   {name:<9} {candidate['formula']}: "
                f"{_coefficients(candidate['coefficients'])}")
            lines.append(
                f"[fit]             held-out APE median {_pct(held['median_ape'])}, p90 "
                f"{_pct(held['p90_ape'])}, max {_pct(held['max_ape'])} "
                f"({held['k']}-fold over {held['n_levels']} levels); in-sample median "
                f"{_pct(candidate['in_sample']['median_ape'])}"
                + (f"; {held['reason']}" if held.get("reason") else ""))
    return lines


def check_lines(model: CostModel, transfer: CostModel | None = None) -> list[str]:
    """What `check` prints: the model's identity, and per phase every measured level."""
    engine = model.engine or {}
    lines = [f"device {model.device.get('name')}; model {model.model.get('name')}; engine "
             f"{engine.get('name', '-')} {engine.get('version', '')}".rstrip()]
    for phase, fitted in model.phases.items():
        held = fitted.heldout
        lines.append(f"{phase}: {fitted.family.name} {fitted.family.formula}; "
                     f"{_coefficients(fitted.coefficients)}")
        lines.append(f"  held-out APE median {_pct(held.get('median_ape'))}, p90 "
                     f"{_pct(held.get('p90_ape'))}, max {_pct(held.get('max_ape'))} "
                     f"({held.get('k')}-fold over {held.get('n_levels')} levels)")
        names = list(fitted.ranges)
        extra = f" {'on ' + transfer.device['name'] + ' ms':>18}" if transfer else ""
        lines.append(f"  {'level':<18} {names[0]:>9} {names[1]:>12} {'measured ms':>12} "
                     f"{'fit ms':>9} {'held-out ms':>12} {'held-out APE':>13}{extra}")
        for level in fitted.levels:
            x = level["x"]
            moved = ""
            if transfer is not None:
                moved = f" {_ms(transfer.phases[phase].predict(x).seconds):>18}"
            lines.append(
                f"  {level['level']:<18} {x[names[0]]:>9.0f} {x[names[1]]:>12.0f} "
                f"{_ms(level['measured_s']):>12} {_ms(level['predicted_s']):>9} "
                f"{_ms(level['heldout_predicted_s']):>12} {_pct(level['heldout_ape']):>13}"
                f"{moved}")
    if transfer is not None:
        lines.append(f"transfer to {transfer.device['name']}: roofline efficiencies of the "
                     "measured device on that device's datasheet limits; not validated by any "
                     "measurement there")
    return lines
