"""GPU telemetry with nvidia-ml-py (NVML), about every second, into `gpu.jsonl` (schema 1).

One line per GPU per sample: `t_s` (time.monotonic minus `origin_s`), `gpu` (index), `name`,
`utilization_pct`, `memory_used_bytes`, `memory_total_bytes`, `power_w`, `sm_clock_mhz`,
`energy_j` (the driver's cumulative counter since it loaded: differences give the energy of a
span), `other_processes` (the GPU's compute processes outside the run's own, as `{pid,
used_memory_bytes}`: another job on the GPU; a pid NVML reports from another PID namespace, as
inside some containers, shows here too) and `clock_reasons` (why the clocks are held down now:
NVML's clocks-event, formerly throttle, reasons by name, e.g. `sw_power_cap`,
`hw_thermal_slowdown`; `gpu_idle` alone is no throttling). A field the GPU does not report is
null. Where NVML is missing or sees no GPU the file
gets exactly one line, `{"t_s", "telemetry": "off", "reason"}`, and nothing is sampled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.periodic import Periodic
from compaction_bench.serve.hardware import NvmlUnavailableError, close_nvml, open_nvml, text


class GpuSampler:
    """A daemon thread writing one line per GPU every `interval_s`; see the module docstring.

    NVML is opened through `serve.hardware` (`nvml` may be injected: tests pass a stand-in for
    the library; by default pynvml). `enabled` tells whether telemetry runs; `reason` says why
    not.
    """

    def __init__(self, path: str | Path, *, interval_s: float = 1.0, origin: float = 0.0,
                 nvml: ModuleType | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 own_pids: Callable[[], Iterable[int]] | None = None) -> None:
        self.writer = JsonlWriter(path)
        self.interval_s = interval_s
        self.origin_s = origin
        self.clock = clock
        self.enabled = False
        self.reason: str | None = None
        self.samples = 0
        self._nvml = nvml
        # the run's own processes (bench/run/hostwatch.py); None: this process alone
        self.own_pids = own_pids or (lambda: {os.getpid()})
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._beat = Periodic(self.sample_once, interval_s=interval_s, clock=clock,
                              name="gpu-sampler")

    def start(self) -> GpuSampler:
        try:
            nvml = open_nvml(self._nvml)
        except NvmlUnavailableError as exc:
            self._off(str(exc))
            return self
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception as exc:  # an NVMLError: a driver that answers init but not this
            close_nvml(nvml)
            self._off(f"NVML could not list the GPUs ({type(exc).__name__}: {exc})")
            return self
        if not self._handles:
            close_nvml(nvml)
            self._off("NVML found no GPU (nvmlDeviceGetCount() = 0)")
            return self
        self.enabled = True
        self._beat.start()
        return self

    def _off(self, reason: str) -> None:
        self.reason = reason
        self.writer.write({"t_s": self.clock() - self.origin_s, "telemetry": "off",
                           "reason": reason})

    def sample_once(self) -> list[dict[str, Any]]:
        nvml = self._nvml
        assert nvml is not None
        rows = []
        for index, handle in enumerate(self._handles):
            memory = _try(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = _try(nvml.nvmlDeviceGetPowerUsage, handle)
            energy = _try(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            util = _try(nvml.nvmlDeviceGetUtilizationRates, handle)
            row = {
                "t_s": self.clock() - self.origin_s, "gpu": index, "name": self._names[index],
                "utilization_pct": getattr(util, "gpu", None),
                "memory_used_bytes": getattr(memory, "used", None),
                "memory_total_bytes": getattr(memory, "total", None),
                "power_w": power / 1000 if power is not None else None,
                "sm_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                "energy_j": energy / 1000 if energy is not None else None,
                "other_processes": other_processes(_try(
                    lambda h: nvml.nvmlDeviceGetComputeRunningProcesses(h), handle),
                    self.own_pids()),
                "clock_reasons": clock_reasons(_try(_reasons_call(nvml), handle)),
            }
            self.writer.write(row)
            rows.append(row)
        self.samples += 1
        return rows

    def stop(self) -> None:
        self._beat.stop()
        if self.enabled and self._nvml is not None:
            close_nvml(self._nvml)  # never raises: telemetry must never fail a run
            self.enabled = False
        self.writer.close()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _try(call: Callable[..., Any], *args: Any) -> Any:
    """The value, or None where this GPU does not support the query (NVMLError)."""
    try:
        return call(*args)
    except Exception:
        return None



# NVML's clocks-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*)
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def _reasons_call(nvml: ModuleType) -> Callable[..., Any]:
    """nvmlDeviceGetCurrentClocksEventReasons (newer drivers' name), else the older
    nvmlDeviceGetCurrentClocksThrottleReasons; a call that fails where neither exists."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        found = getattr(nvml, name, None)
        if callable(found):
            return found  # type: ignore[no-any-return]

    def missing(handle: Any) -> Any:
        raise AttributeError("this NVML has no clocks-event reasons")
    return missing


def clock_reasons(mask: int | None) -> list[str] | None:
    """The names of the reason bits set in `mask` (unknown bits as hex); None: not reported."""
    if not isinstance(mask, int):
        return None
    names = [name for bit, name in CLOCK_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_REASONS)
    return names + ([f"0x{rest:x}"] if rest else [])


def other_processes(procs: Iterable[Any] | None, own: Iterable[int]
                    ) -> list[dict[str, Any]] | None:
    """The GPU's compute processes whose pid is not the run's own; None: not reported."""
    if procs is None:
        return None
    mine = set(own)
    out = []
    for p in procs:
        pid = getattr(p, "pid", None)
        if isinstance(pid, int) and pid not in mine:
            used = getattr(p, "usedGpuMemory", None)
            out.append({"pid": pid, "used_memory_bytes": used if isinstance(used, int) else None})
    return out
