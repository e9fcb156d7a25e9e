"""What accelerator this machine has, read through NVML (nvidia-ml-py). No GPU is not an error."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float
    driver: str


def detect_gpus() -> list[Gpu]:
    """The NVIDIA GPUs NVML sees; an empty list where there is no driver or no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(i, _text(pynvml.nvmlDeviceGetName(handle)), mem.total / 2**30, driver))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def describe_host() -> dict[str, object]:
    """Hardware facts for run manifests."""
    gpus = detect_gpus()
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": [g.__dict__ for g in gpus],
    }
