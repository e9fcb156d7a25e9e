"""The GPU device check end to end at its quick size (GPU only; the no-GPU line is tested in
test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compaction_bench.kernels.devicecheck import run_device_check
from compaction_bench.kernels.resultfile import read_results


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the device check runs on a CUDA GPU only")
def test_quick_device_check_writes_micro_entropy_and_telemetry(tmp_path: Path) -> None:
    path = run_device_check(tmp_path, quick=True, sampler_seconds=3.0, argv=["test"],
                            say=lambda line: None)
    document = read_results(path)
    assert document["kind"] == "device-check" and path.name.endswith(".json")
    assert any(m["impl"] == "triton" for m in document["micro"]["measurements"])
    assert "fused-triton" in document["entropy"]["shapes"][0]["runs"]
    telemetry = document["telemetry"]
    assert telemetry["enabled"] and telemetry["samples"]
    assert "utilization_pct" in telemetry["samples"][0]
