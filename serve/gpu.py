"""GPU telemetry with nvidia-ml-py (NVML), about every second, into `gpu.jsonl` (schema 1).

One line per GPU per sample: `t_s` (time.monotonic minus `origin_s`), `gpu` (index), `name`,
`utilization_pct`, `memory_used_bytes`, `memory_total_bytes`, `power_w`, `sm_clock_mhz`,
`energy_j` (the driver's cumulative counter since it loaded: differences give the energy of a
span). A field the GPU does not report is null. Where NVML is missing or sees no GPU the file
gets exactly one line, `{"t_s", "telemetry": "off", "reason"}`, and nothing is sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writer = JsonlWriter(path)
        self.interval_s = interval_s
        self.origin_s = origin
        self.clock = clock
        self.enabled = False
        self.reason: str | None = None
        self.samples = 0
        self._nvml = nvml
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

