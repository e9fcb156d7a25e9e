"""What machine this is: one CPU name for every record, GPUs through the one NVML opener (a
stand-in library where the test needs a GPU, the real one otherwise)."""

from __future__ import annotations

import types

import pytest

from compaction_bench.common.provenance import host_facts
from compaction_bench.serve.hardware import (
    Gpu,
    NvmlUnavailableError,
    describe_host,
    detect_gpus,
    driver_version,
    open_nvml,
)


def _stand_in(shutdowns: list[int]) -> types.ModuleType:
    nvml = types.ModuleType("nvml_stub")
    memory = types.SimpleNamespace(used=1 << 30, total=141 << 30)
    for name, fn in {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: shutdowns.append(1),
        "nvmlSystemGetDriverVersion": lambda: b"580.82.07",
        "nvmlDeviceGetCount": lambda: 2, "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: f"Stand-in H{h}",
        "nvmlDeviceGetMemoryInfo": lambda h: memory,
    }.items():
        setattr(nvml, name, fn)
    return nvml


def test_gpus_and_driver_through_a_stand_in_library() -> None:
    shutdowns: list[int] = []
    nvml = _stand_in(shutdowns)
    assert detect_gpus(nvml) == [Gpu(0, "Stand-in H0", 141.0, "580.82.07"),
                                 Gpu(1, "Stand-in H1", 141.0, "580.82.07")]
    assert driver_version(nvml) == "580.82.07"
    assert len(shutdowns) == 2  # every opening is closed again


def test_a_missing_library_is_no_gpu_with_the_reason() -> None:
    def missing() -> None:
        raise OSError("NVML Shared Library Not Found")

    nvml = types.ModuleType("nvml_stub")
    nvml.nvmlInit = missing  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailableError, match="OSError: NVML Shared Library Not Found"):
        open_nvml(nvml)
    assert detect_gpus(nvml) == [] and driver_version(nvml) is None


def test_the_manifest_and_the_kernels_name_the_cpu_alike() -> None:
    """One answer to "what machine is this": the manifest's hardware and the provenance every
    kernels results file carries name the same CPU."""
    host = describe_host()
    assert host["cpu"] == host_facts()["cpu"] and host["cpu"]
    assert host["gpus"] == [g.__dict__ for g in detect_gpus()]  # the real NVML, GPU or not
