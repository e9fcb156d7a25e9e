"""The fitted cost model, as the capacity plan uses it.

    from compaction_bench.kernels.costmodel import load
    model = load("data/kernels/<device>__<model>__<engine>.json")
    model.predict_prefill_s(uncached_tokens=2048, cached_tokens=8192)   # seconds
    model.predict_decode_step_s(batch=16, mean_context=12000)            # seconds per step
    model.predict_decode_step(16, 12000).heldout_median_ape              # its measured error
    model.heldout_mape                       # {"prefill": %, "decode": %} on held-out levels
    model.measured_levels("decode")          # every measured level: measured vs predicted
    model.on_device(limits_for("NVIDIA H100"))  # roofline transfer to an unmeasured device

Every `Prediction` carries the error its model family showed on held-out sweep levels of the
measured device (kernels/fitting.py), whether the point lies inside the measured ranges, and
`validated=False` where it is a transfer to a device that was never measured (its error is
unknown there, and says so). `fit_phases` builds the `fits` section of a results file from
probe levels; the file format is kernels/SCHEMA.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compaction_bench.kernels.fitting import (
    PHASES,
    X_NAMES,
    Family,
    Linear,
    Point,
    Roofline,
    choose,
    evaluate,
)
from compaction_bench.kernels.limits import DeviceLimits
from compaction_bench.kernels.resultfile import ResultsError, read_results
from compaction_bench.kernels.shapes import ModelShape

SELECTION = ("the family with the lowest median absolute percentage error on k-fold held-out "
             "sweep levels (ties: linear)")


def points(phase: str, levels: list[dict[str, Any]]) -> list[Point]:
    """Probe level rows -> fit points (levels without a measured median are left out)."""
    names = X_NAMES[phase]
    return [Point(level=str(row["level"]), x={n: float(row[n]) for n in names},
                  y=float(row["median_s"]))
            for row in levels if row.get("median_s") and all(row.get(n) is not None
                                                              for n in names)]


def repeat_spread(levels: list[dict[str, Any]]) -> float | None:
    """Median over levels of (max - min) / median of a level's repeated measurements, in
    percent: the measurement noise a fit's error should be read against."""
    spreads = []
    for row in levels:
        values = sorted(row.get("ttft_s") or row.get("step_s") or [])
        if len(values) >= 2:
            spreads.append(100.0 * (values[-1] - values[0]) / float(np.median(values)))
    return float(np.median(spreads)) if spreads else None


def _dtype(shape: ModelShape) -> str:
    return "fp8" if shape.weight_bytes == 1.0 else "bf16"


def families(phase: str, shape: ModelShape | None,
             limits: DeviceLimits | None) -> tuple[list[Family], dict[str, str]]:
    """The candidate families for a phase, and why any is missing."""
    out: list[Family] = [Linear(phase)]
    missing: dict[str, str] = {}
    if shape is None or limits is None:
        missing["roofline"] = "needs the model's shape and the device's limits (run the micro-" \
                              "benchmarks in the same run, or give the GPU a limits row)"
    elif not shape.attention_known:
        missing["roofline"] = f"the attention of {shape.name} is unknown (kernels/shapes.py)"
    else:
        try:
            out.append(Roofline(phase, shape, limits, _dtype(shape)))
        except ValueError as exc:
            missing["roofline"] = str(exc)
    return out, missing


def fit_phases(levels: dict[str, list[dict[str, Any]]], shape: ModelShape | None,
               limits: DeviceLimits | None, *, seed: int = 0) -> dict[str, Any]:
    """The `fits` section: every candidate family per phase, evaluated, and the chosen one."""
    out: dict[str, Any] = {}
    for phase in PHASES:
        found = points(phase, levels.get(phase, []))
        if not found:
            continue
        candidates: dict[str, dict[str, Any]] = {}
        fams, missing = families(phase, shape, limits)
        for family in fams:
            candidates[family.name] = evaluate(family, found, seed=seed)
            if isinstance(family, Roofline):
                candidates[family.name].update(
                    dtype=family.dtype, peak_flops_per_s=family.peak_flops,
                    peak_bytes_per_s=family.peak_bytes, limits=family.limits.name)
        candidates.update({name: {"family": name, "unavailable": why}
                           for name, why in missing.items()})
        out[phase] = {"chosen": choose(candidates), "selection": SELECTION,
                      "candidates": candidates,
                      "repeat_spread_median_pct": repeat_spread(levels.get(phase, [])),
                      "ranges": {n: [min(p.x[n] for p in found), max(p.x[n] for p in found)]
                                 for n in X_NAMES[phase]}}
    return out


@dataclass(frozen=True)
class Prediction:
    """A predicted time with the error its model showed where it could be measured."""

    seconds: float
    phase: str
    family: str
    heldout_median_ape: float | None  # percent, on held-out levels of the measured device
    heldout_p90_ape: float | None
    in_measured_range: bool
    validated: bool  # False: a transfer to an unmeasured device; its error there is unknown
    note: str = ""


@dataclass(frozen=True)
class PhaseModel:
    """The chosen fit of one phase."""

    phase: str
    family: Family
    coefficients: dict[str, Any]
    heldout: dict[str, Any]
    levels: list[dict[str, Any]]
    ranges: dict[str, list[float]]
    validated: bool = True
    note: str = ""

    def predict(self, x: dict[str, float]) -> Prediction:
        inside = all(lo <= x[n] <= hi for n, (lo, hi) in self.ranges.items())
        return Prediction(
            seconds=self.family.predict(self.coefficients, x), phase=self.phase,
            family=self.family.name,
            heldout_median_ape=self.heldout.get("median_ape") if self.validated else None,
            heldout_p90_ape=self.heldout.get("p90_ape") if self.validated else None,
            in_measured_range=inside, validated=self.validated,
            note=self.note or ("" if inside else "outside the measured sweep: extrapolated"))


class CostModel:
    """Step-time predictions for one device, model and engine (see the module docstring)."""

    def __init__(self, document: dict[str, Any], phases: dict[str, PhaseModel],
                 source: str = "") -> None:
        self.document = document
        self.phases = phases
        self.source = source
        self.device: dict[str, Any] = document.get("device") or {}
        self.model: dict[str, Any] = document.get("model") or {}
        self.engine: dict[str, Any] = document.get("engine") or {}

    def _phase(self, phase: str) -> PhaseModel:
        if phase not in self.phases:
            raise ResultsError(f"{self.source or 'results'}: no {phase} fit (the probe did not "
                               f"measure {phase} levels); rerun `make kernels`")
        return self.phases[phase]

    def predict_prefill(self, uncached_tokens: float, cached_tokens: float) -> Prediction:
        return self._phase("prefill").predict({"uncached": float(uncached_tokens),
                                               "cached": float(cached_tokens)})

    def predict_decode_step(self, batch: float, mean_context: float) -> Prediction:
        return self._phase("decode").predict({"batch": float(batch),
                                              "mean_context": float(mean_context)})

    def predict_prefill_s(self, uncached_tokens: float, cached_tokens: float) -> float:
        return self.predict_prefill(uncached_tokens, cached_tokens).seconds

    def predict_decode_step_s(self, batch: float, mean_context: float) -> float:
        return self.predict_decode_step(batch, mean_context).seconds

    @property
    def heldout_mape(self) -> dict[str, float | None]:
        """Median absolute percentage error on held-out sweep levels, per phase."""
        return {name: (p.heldout.get("median_ape") if p.validated else None)
                for name, p in self.phases.items()}

    def measured_levels(self, phase: str) -> list[dict[str, Any]]:
        """Every measured level: settings, measured and predicted seconds, held-out error."""
        return [dict(level) for level in self._phase(phase).levels]

    def on_device(self, limits: DeviceLimits) -> CostModel:
        """The roofline fits carried over to another device's limits (same model and engine,
        same efficiencies and overhead: an assumption no measurement here checks)."""
        moved: dict[str, PhaseModel] = {}
        for name in self.phases:
            base = _phase_model(self.document, name, "roofline", self.source)
            family = base.family
            assert isinstance(family, Roofline)
            moved[name] = dataclasses.replace(
                base, family=Roofline(name, family.shape, limits, family.dtype),
                validated=False,
                note=f"transferred from {self.device.get('name')} to {limits.name} by the "
                     "roofline's efficiencies; no measurement on that device")
        document = {**self.document, "device": {"name": limits.name, "transferred_from":
                                                self.device}}
        return CostModel(document, moved, self.source)


def _phase_model(document: dict[str, Any], phase: str, family_name: str,
                 source: str) -> PhaseModel:
    fit = document["fits"][phase]
    entry = fit["candidates"].get(family_name)
    if not entry or "coefficients" not in entry:
        why = (entry or {}).get("unavailable", "not fitted")
        raise ResultsError(f"{source}: fits.{phase}.candidates.{family_name}: {why}")
    family: Family
    if family_name == "linear":
        family = Linear(phase)
    elif family_name == "roofline":
        shape = document.get("model", {}).get("shape")
        limits = document.get("limits")
        if not shape or not limits:
            raise ResultsError(f"{source}: a roofline fit needs model.shape and limits")
        family = Roofline(phase, ModelShape.from_json(shape), DeviceLimits.from_json(limits),
                          entry.get("dtype") or _dtype(ModelShape.from_json(shape)))
    else:
        raise ResultsError(f"{source}: fits.{phase}: unknown family {family_name!r}")
    return PhaseModel(phase=phase, family=family, coefficients=dict(entry["coefficients"]),
                      heldout=dict(entry.get("heldout") or {}), levels=list(entry["levels"]),
                      ranges={k: list(v) for k, v in fit["ranges"].items()})


def from_document(document: dict[str, Any], source: str = "") -> CostModel:
    """A cost model from a results document's `fits` (the chosen family per phase)."""
    fits = document.get("fits")
    if not isinstance(fits, dict) or not fits:
        raise ResultsError(f"{source}: has no fits (a micro-only or device-check file); the "
                           "fits come from `make kernels` against a server")
    phases = {}
    for phase, fit in fits.items():
        chosen = fit.get("chosen") if isinstance(fit, dict) else None
        if not chosen:
            raise ResultsError(f"{source}: fits.{phase}.chosen is missing")
        phases[phase] = _phase_model(document, phase, chosen, source)
    return CostModel(document, phases, source)


def load(path: str | Path) -> CostModel:
    """Read a results file (kernels/SCHEMA.md) and build its cost model."""
    return from_document(read_results(path), str(path))
