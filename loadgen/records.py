"""Raw records as they happen: one JSON object per line, appended with a single `write`.

Contract: `JsonlWriter.write` encodes the whole line first and hands it to the kernel in one
`os.write` on a file opened with O_APPEND, so several processes (locust workers, the bench) can
append to one file without interleaving lines, and a crash loses at most the line being written.
Every line carries `"schema": SCHEMA` (bench/summary_schema.md).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

SCHEMA = 1


class JsonlWriter:
    """Append-only JSONL writer; safe across threads, greenlets and processes (see module)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` (with `schema` added when absent) as one line."""
        line = {"schema": SCHEMA, **record}
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: writer is closed")
            view = memoryview(data)
            while view:  # a regular file takes it in one write; loop only on a short write
                written = os.write(self._fd, view)
                view = view[written:]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every parseable object line of `path` (a cut last line is skipped); for tests and tools."""
    rows: list[dict[str, Any]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            rows.append(value)
    return rows
