"""Physical limits of a device: memory bandwidth and dense tensor throughput per dtype.

The GPU rows live in `kernels/limits.toml` beside this file, each with its sources. A CPU has
no row: `measured_limits` builds its limits from the host's own best measured copy/read
bandwidth and matmul throughput (kernels/micro.py), and says so in `sources`.

Standard library only (the GPU device check imports this with nothing but PyTorch installed).
Bad rows raise `LimitsError` naming the file, the row and the field.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError

LIMITS_FILE = Path(__file__).with_name("limits.toml")
_FIELDS = {"match", "description", "memory_bytes", "hbm_bytes_per_s", "dense_flops", "sources",
           "notes"}


class LimitsError(SuiteError):
    """The limits table is unreadable or a row is malformed; the message names the field."""


@dataclass(frozen=True)
class DeviceLimits:
    """What a device can do at most. `dense_flops` maps a dtype name (bf16, fp8, ...) to FLOP/s;
    `measured` is True where the figures are this host's measured peaks, not a datasheet's."""

    name: str
    hbm_bytes_per_s: float
    dense_flops: dict[str, float]
    sources: tuple[str, ...]
    match: str = ""
    description: str = ""
    memory_bytes: float | None = None
    notes: str = ""
    measured: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def flops(self, dtype: str) -> float | None:
        """Dense throughput for `dtype` in FLOP/s, or None where the table has none."""
        return self.dense_flops.get(dtype)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "match": self.match, "description": self.description,
                "memory_bytes": self.memory_bytes, "hbm_bytes_per_s": self.hbm_bytes_per_s,
                "dense_flops": dict(self.dense_flops), "sources": list(self.sources),
                "notes": self.notes, "measured": self.measured, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceLimits:
        """The inverse of `to_json` (results files carry the limits they were held against)."""
        known = {"name", "match", "description", "memory_bytes", "hbm_bytes_per_s",
                 "dense_flops", "sources", "notes", "measured"}
        return cls(name=str(data["name"]), hbm_bytes_per_s=float(data["hbm_bytes_per_s"]),
                   dense_flops={str(k): float(v) for k, v in data["dense_flops"].items()},
                   sources=tuple(str(s) for s in data.get("sources", ())),
                   match=str(data.get("match", "")),
                   description=str(data.get("description", "")),
                   memory_bytes=data.get("memory_bytes"), notes=str(data.get("notes", "")),
                   measured=bool(data.get("measured", False)),
                   extra={k: v for k, v in data.items() if k not in known})


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value <= 0:
        raise LimitsError(f"{where}: must be a positive number, got {value!r}")
    return float(value)


def _row(path: Path, name: str, row: Any) -> DeviceLimits:
    where = f"{path}: devices.{name}"
    if not isinstance(row, dict):
        raise LimitsError(f"{where}: must be a table")
    unknown = sorted(set(row) - _FIELDS)
    if unknown:
        raise LimitsError(f"{where}: unknown field {', '.join(unknown)} (known: "
                          f"{', '.join(sorted(_FIELDS))})")
    for required in ("match", "hbm_bytes_per_s", "dense_flops", "sources"):
        if required not in row:
            raise LimitsError(f"{where}.{required}: required field is missing")
    flops = row["dense_flops"]
    if not isinstance(flops, dict) or not flops:
        raise LimitsError(f"{where}.dense_flops: must be a table of dtype = FLOP/s")
    sources = row["sources"]
    if not isinstance(sources, list) or not sources or not all(
            isinstance(s, str) and s.strip() for s in sources):
        raise LimitsError(f"{where}.sources: must be a non-empty list of strings: every figure "
                          "needs the document it comes from")
    memory = row.get("memory_bytes")
    return DeviceLimits(
        name=name, match=str(row["match"]), description=str(row.get("description", "")),
        memory_bytes=_positive(f"{where}.memory_bytes", memory) if memory is not None else None,
        hbm_bytes_per_s=_positive(f"{where}.hbm_bytes_per_s", row["hbm_bytes_per_s"]),
        dense_flops={str(k): _positive(f"{where}.dense_flops.{k}", v) for k, v in flops.items()},
        sources=tuple(sources), notes=str(row.get("notes", "")))


def load_limits(path: str | Path = LIMITS_FILE) -> list[DeviceLimits]:
    """Every row of the table, in file order (the order `limits_for` matches in)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LimitsError(f"{file}: cannot read the limits table ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise LimitsError(f"{file}: not valid TOML: {exc}") from None
    devices = data.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise LimitsError(f"{file}: needs [devices.<name>] tables")
    return [_row(file, name, row) for name, row in devices.items()]


def limits_for(device_name: str, path: str | Path = LIMITS_FILE) -> DeviceLimits | None:
    """The first row whose `match` is in `device_name` ('NVIDIA H200' -> H200), else None."""
    return next((row for row in load_limits(path) if row.match and row.match in device_name),
                None)


def measured_limits(name: str, *, bandwidth_bytes_per_s: float, flops: dict[str, float],
                    how: str) -> DeviceLimits:
    """Limits from this host's measured peaks (a CPU): `how` says what was measured."""
    return DeviceLimits(
        name=name, hbm_bytes_per_s=bandwidth_bytes_per_s, dense_flops=dict(flops),
        sources=(f"measured on this host: {how}",), measured=True,
        notes="measured peaks, not a datasheet: a fraction of them says how close a kernel "
              "comes to the best this host showed during the same run")
