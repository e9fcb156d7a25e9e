"""GPU telemetry: the no-GPU path (this machine) and the sampling path with a stand-in NVML."""

from __future__ import annotations

import types
from pathlib import Path

from compaction_bench.common.files import read_jsonl
from compaction_bench.serve.gpu import GpuSampler, clock_reasons, other_processes


def test_no_gpu_writes_one_line_and_samples_nothing(tmp_path: Path) -> None:
    def missing() -> None:
        raise OSError("NVML Shared Library Not Found")

    nvml = types.ModuleType("nvml_stub")
    nvml.nvmlInit = missing  # type: ignore[attr-defined]
    path = tmp_path / "gpu.jsonl"
    with GpuSampler(path, interval_s=0.01, nvml=nvml) as sampler:
        assert not sampler.enabled and sampler.reason and "NVML" in sampler.reason
        assert "Shared Library Not Found" in sampler.reason  # the library's own words
    rows = read_jsonl(path).objects
    assert len(rows) == 1 and rows[0]["telemetry"] == "off" and "reason" in rows[0]


def test_real_library_here_is_off_or_on(tmp_path: Path) -> None:
    """With the real pynvml: one 'off' line on a machine without a GPU, samples with one."""
    path = tmp_path / "gpu.jsonl"
    with GpuSampler(path, interval_s=0.05) as sampler:
        enabled = sampler.enabled
    rows = read_jsonl(path).objects
    if not enabled:
        assert len(rows) == 1 and rows[0]["telemetry"] == "off"
    else:
        assert rows and "utilization_pct" in rows[0]


def test_sampling_with_a_stand_in_library(tmp_path: Path) -> None:
    nvml = types.ModuleType("nvml_stub")
    memory = types.SimpleNamespace(used=5 << 30, total=80 << 30)

    def unsupported(handle: object) -> int:
        raise RuntimeError("not supported")

    nvml.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    for name, fn in {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1, "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"Stand-in GPU",
        "nvmlDeviceGetMemoryInfo": lambda h: memory,
        "nvmlDeviceGetPowerUsage": lambda h: 300_000,
        "nvmlDeviceGetTotalEnergyConsumption": unsupported,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=87),
        "nvmlDeviceGetClockInfo": lambda h, kind: 1980,
    }.items():
        setattr(nvml, name, fn)
    path = tmp_path / "gpu.jsonl"
    with GpuSampler(path, interval_s=0.02, nvml=nvml) as sampler:
        assert sampler.enabled
        sampler.sample_once()
    rows = read_jsonl(path).objects
    assert rows and rows[0]["name"] == "Stand-in GPU" and rows[0]["utilization_pct"] == 87
    assert rows[0]["power_w"] == 300.0 and rows[0]["sm_clock_mhz"] == 1980
    assert rows[0]["energy_j"] is None and rows[0]["memory_used_bytes"] == 5 << 30
    # a stand-in without the process and clock-reason queries: recorded as not reported
    assert rows[0]["other_processes"] is None and rows[0]["clock_reasons"] is None


def test_other_processes_and_clock_reasons_with_a_stand_in_library(tmp_path: Path) -> None:
    """The GPU's compute processes outside the run's own set, and the clocks-event reasons by
    name (issue 30: another job on the GPU or a power cap moves an arm's time)."""
    nvml = types.ModuleType("nvml_stub")
    nvml.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    procs = [types.SimpleNamespace(pid=10, usedGpuMemory=1 << 30),
             types.SimpleNamespace(pid=77, usedGpuMemory=2 << 30),
             types.SimpleNamespace(pid=78, usedGpuMemory=None)]
    for name, fn in {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1, "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: "Stand-in GPU",
        **{n: lambda *a: None for n in (
            "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetUtilizationRates")},
        "nvmlDeviceGetComputeRunningProcesses": lambda h: procs,
        # the older name only: the sampler falls back to it
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x4 | 0x40 | 0x2000,
    }.items():
        setattr(nvml, name, fn)
    path = tmp_path / "gpu.jsonl"
    with GpuSampler(path, interval_s=10, nvml=nvml, own_pids=lambda: {10, 11}):
        pass
    row = read_jsonl(path).objects[0]
    assert row["other_processes"] == [{"pid": 77, "used_memory_bytes": 2 << 30},
                                      {"pid": 78, "used_memory_bytes": None}]
    assert row["clock_reasons"] == ["sw_power_cap", "hw_thermal_slowdown", "0x2000"]
    assert clock_reasons(0) == [] and clock_reasons(None) is None
    assert other_processes(None, {1}) is None and other_processes([], {1}) == []
