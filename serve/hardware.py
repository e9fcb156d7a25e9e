"""What machine this is: its CPU (named by `common.provenance`) and its NVIDIA GPUs, read
through NVML (nvidia-ml-py). No GPU is not an error.

This is the one place the suite opens NVML: the launcher's engine check and the manifest's
hardware (`detect_gpus`, `describe_host`), the bench's GPU telemetry (`serve.gpu`, through
`open_nvml` / `close_nvml`, held open while it samples) and the GPU device check's driver
version (`kernels.devicecheck`). A stand-in for the library may be passed wherever NVML is
opened (the tests of the sampler do).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from compaction_bench.common.provenance import cpu_model


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float
    driver: str


class NvmlUnavailableError(Exception):
    """NVML cannot be opened here (no library, no driver); the message says which."""


def open_nvml(module: ModuleType | None = None) -> ModuleType:
    """NVML (`module`, by default pynvml), initialised; close it with `close_nvml`. Raises
    `NvmlUnavailableError` naming the reason where the library or the driver is missing."""
    try:
        nvml = module if module is not None else _pynvml()
        nvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailableError(f"NVML unavailable ({type(exc).__name__}: {exc}); no NVIDIA "
                              "driver on this machine") from exc
    return nvml


def _pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def close_nvml(nvml: ModuleType) -> None:
    """Shut NVML down; never raises (telemetry must never fail a run)."""
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


@contextlib.contextmanager
def nvml_open(module: ModuleType | None = None) -> Iterator[ModuleType]:
    """`with nvml_open() as nvml:` NVML initialised inside the block (NvmlUnavailableError
    where it cannot be)."""
    nvml = open_nvml(module)
    try:
        yield nvml
    finally:
        close_nvml(nvml)


def text(value: Any) -> str:
    """A string NVML returned (bytes in older nvidia-ml-py releases)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpus(module: ModuleType | None = None) -> list[Gpu]:
    """The NVIDIA GPUs NVML sees; an empty list where there is no driver or no GPU."""
    try:
        with nvml_open(module) as nvml:
            driver = text(nvml.nvmlSystemGetDriverVersion())
            gpus = []
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(Gpu(i, text(nvml.nvmlDeviceGetName(handle)), mem.total / 2**30,
                                driver))
            return gpus
    except NvmlUnavailableError:
        return []


def driver_version(module: ModuleType | None = None) -> str | None:
    """The NVIDIA driver's version, or None where NVML cannot be opened."""
    try:
        with nvml_open(module) as nvml:
            return text(nvml.nvmlSystemGetDriverVersion())
    except NvmlUnavailableError:
        return None


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first processor's `flags` line); empty where unreadable."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as found:
            for line in found:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def fast_bfloat16(flags: frozenset[str] | None = None) -> bool | None:
    """Whether vLLM's CPU build has a fast bfloat16 matmul here: AVX-512 (oneDNN's bf16 path).
    Without it oneDNN refuses the bf16 linear ("Failed to create oneDNN linear, fallback to
    torch linear") and a prefill runs 4-6 times slower than in float32. None: flags unknown."""
    found = cpu_flags() if flags is None else flags
    return None if not found else "avx512f" in found


def describe_host() -> dict[str, object]:
    """Hardware facts for run manifests: the CPU by the name every record of the suite uses
    (`common.provenance.cpu_model`), its logical cores, whether it has AVX-512 (which decides a
    CPU profile's dtype) and the GPUs."""
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "avx512": fast_bfloat16(),
            "gpus": [asdict(g) for g in detect_gpus()]}
