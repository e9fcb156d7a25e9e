"""The physical limits table: the shipped rows load with their sources and match GPU names;
a malformed row is refused with the file, the row and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.kernels.limits import (
    DeviceLimits,
    LimitsError,
    limits_for,
    load_limits,
    measured_limits,
)


def test_shipped_table_has_the_three_gpus_with_sources() -> None:
    rows = {row.name: row for row in load_limits()}
    assert set(rows) == {"B300", "H200", "H100"}
    for row in rows.values():
        assert row.sources and all("http" in s for s in row.sources)
        assert row.flops("bf16") and row.flops("fp8")
        assert row.flops("fp8") == pytest.approx(2 * row.flops("bf16"), rel=0.01)  # type: ignore[operator]
    assert rows["H200"].hbm_bytes_per_s == 4.8e12
    assert rows["H100"].hbm_bytes_per_s == 3.35e12
    assert rows["B300"].hbm_bytes_per_s == 8.0e12


def test_gpu_names_match_rows() -> None:
    h200 = limits_for("NVIDIA H200")
    h100 = limits_for("NVIDIA H100 80GB HBM3")
    assert h200 is not None and h200.name == "H200"
    assert h100 is not None and h100.name == "H100"
    assert limits_for("NVIDIA A100-SXM4-80GB") is None


def test_round_trip_through_json() -> None:
    row = measured_limits("cpu", bandwidth_bytes_per_s=1e10, flops={"bf16": 1e11}, how="x")
    again = DeviceLimits.from_json(row.to_json())
    assert again == row and again.measured


@pytest.mark.parametrize(("body", "fault"), [
    ('[devices.X]\nmatch="X"\nhbm_bytes_per_s=1e12\ndense_flops={bf16=1e15}\n',
     "devices.X.sources: required field is missing"),
    ('[devices.X]\nmatch="X"\nhbm_bytes_per_s=-1\ndense_flops={bf16=1e15}\nsources=["s"]\n',
     "devices.X.hbm_bytes_per_s: must be a positive number"),
    ('[devices.X]\nmatch="X"\nhbm_bytes_per_s=1e12\ndense_flops={bf16=1e15}\nsources=["s"]\n'
     'bandwith=3\n', "devices.X: unknown field bandwith"),
    ('[devices.X]\nmatch="X"\nhbm_bytes_per_s=1e12\ndense_flops={bf16="fast"}\nsources=["s"]\n',
     "devices.X.dense_flops.bf16: must be a positive number"),
    ("devices = 3\n", "needs [devices.<name>] tables"),
    ("[devices.X\n", "not valid TOML"),
])
def test_bad_rows_name_the_field(tmp_path: Path, body: str, fault: str) -> None:
    path = tmp_path / "limits.toml"
    path.write_text(body)
    with pytest.raises(LimitsError) as info:
        load_limits(path)
    assert str(path) in str(info.value) and fault in str(info.value)
