"""The plan's side: a results file written to disk, loaded back, predicting what was measured,
with its held-out error; transfers flagged unvalidated; bad files refused with one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.kernels.costmodel import fit_phases, load
from compaction_bench.kernels.limits import limits_for, measured_limits
from compaction_bench.kernels.resultfile import (
    ResultsError,
    new_document,
    read_results,
    write_results,
)
from compaction_bench.kernels.shapes import shape_for_profile

pytestmark = pytest.mark.e2e

A, B, C = 0.05, 6e-4, 4e-8
S0, S1, S2 = 0.04, 2e-3, 1.5e-6


def levels() -> dict[str, list[dict[str, Any]]]:
    prefill = [{"level": f"u={u},P={p}", "uncached": u, "cached": p,
                "median_s": A + B * u + C * u * (p + (u + 1) / 2)}
               for u in (128, 512, 1024, 2048) for p in (0, 1024, 3072)]
    decode = [{"level": f"b={b},L={ctx}", "batch": b, "mean_context": ctx,
               "median_s": S0 + S1 * b + S2 * b * ctx}
              for b in (1, 2, 3, 4) for ctx in (144, 1040, 3088)]
    unmeasured: dict[str, Any] = {"level": "b=9,L=9", "batch": 9, "mean_context": 9,
                                  "median_s": None}
    decode.append(unmeasured)
    return {"prefill": prefill, "decode": decode}


def write_file(tmp_path: Path) -> Path:
    shape = shape_for_profile("cpu-tiny")
    limits = measured_limits("cpu", bandwidth_bytes_per_s=10e9, flops={"bf16": 400e9},
                             how="test")
    document = new_document("calibration", {"type": "cpu", "name": "test cpu"}, ["test"])
    document["model"] = {"profile": "cpu-tiny", "name": shape.name, "shape": shape.to_json()}
    document["engine"] = {"name": "vllm", "version": "0.0-test"}
    document["limits"] = limits.to_json()
    document["fits"] = fit_phases(levels(), shape, limits, seed=0)
    return write_results(document, tmp_path / "r.json")


def test_round_trip_predicts_the_generating_formula(tmp_path: Path) -> None:
    model = load(write_file(tmp_path))
    assert model.device["name"] == "test cpu" and model.engine["version"] == "0.0-test"
    assert model.predict_prefill_s(1000, 2000) == pytest.approx(
        A + B * 1000 + C * 1000 * (2000 + 1001 / 2), rel=1e-6)
    assert model.predict_decode_step_s(3, 2000) == pytest.approx(S0 + S1 * 3 + S2 * 6000,
                                                                 rel=1e-6)
    prediction = model.predict_decode_step(3, 2000)
    assert prediction.family == "linear" and prediction.validated
    assert prediction.in_measured_range
    assert prediction.heldout_median_ape == model.heldout_mape["decode"]
    assert model.heldout_mape["decode"] is not None and model.heldout_mape["decode"] < 1e-3
    outside = model.predict_decode_step(64, 100000)
    assert not outside.in_measured_range and "extrapolated" in outside.note


def test_measured_levels_carry_measured_predicted_and_heldout(tmp_path: Path) -> None:
    model = load(write_file(tmp_path))
    rows = model.measured_levels("prefill")
    assert len(rows) == 12  # the level without a median was left out of the fit
    assert {"level", "x", "measured_s", "predicted_s", "heldout_predicted_s",
            "heldout_ape"} <= set(rows[0])
    assert all(r["heldout_ape"] is not None for r in rows)
    assert len(model.measured_levels("decode")) == 12


def test_roofline_transfer_to_a_gpu_is_flagged_unvalidated(tmp_path: Path) -> None:
    model = load(write_file(tmp_path))
    h100 = limits_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    moved = model.on_device(h100)
    prediction = moved.predict_prefill(2048, 8192)
    assert prediction.family == "roofline" and not prediction.validated
    assert prediction.heldout_median_ape is None and "no measurement" in prediction.note
    # a device with 100x the bandwidth and ~2500x the FLOP/s predicts a faster step
    assert moved.predict_decode_step_s(4, 3000) < model.predict_decode_step_s(4, 3000)


def test_files_without_fits_or_in_another_format_are_refused(tmp_path: Path) -> None:
    bare = new_document("device-check", {"type": "cuda", "name": "gpu"}, ["test"])
    path = write_results(bare, tmp_path / "bare.json")
    with pytest.raises(ResultsError, match="has no fits"):
        load(path)
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    (tmp_path / "v99.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"v99\.json: schema_version 99"):
        read_results(tmp_path / "v99.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultsError, match=r"bad\.json: not a JSON results file"):
        read_results(tmp_path / "bad.json")
    del data["provenance"]
    data["schema_version"] = 1
    (tmp_path / "partial.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="missing field provenance"):
        read_results(tmp_path / "partial.json")
    with pytest.raises(ResultsError, match="no such results file"):
        read_results(tmp_path / "absent.json")
