"""The run folder's writer: records appended as they happen, on the run's clock.

Safe across threads (the arms) and processes: locust appends background requests to the same
`requests.jsonl`, so every line goes out in one O_APPEND write (`common.files.JsonlWriter`).
`sync()` fsyncs every file (the bench calls it at block ends).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.files import JsonlWriter
from loadgen.client import RequestRecord

FILES = ("requests.jsonl", "arms.jsonl", "blocks.jsonl")


class RunWriter:
    """Appends records to a run folder; times are shifted to seconds from the run's start."""

    def __init__(self, run_dir: Path, origin: float) -> None:
        self.run_dir = run_dir
        self.origin = origin
        self._writers = {name: JsonlWriter(run_dir / name) for name in FILES}

    def request(self, record: RequestRecord, **identity: Any) -> None:
        """A request record (absolute clock times) with its identity (source, regime, block,
        labels such as attempt)."""
        line = record.labelled(**identity).shifted(self.origin)
        self._writers["requests.jsonl"].write(line.to_json())

    def arm(self, record: Any) -> None:
        self._writers["arms.jsonl"].write(asdict(record))

    def block(self, record: Any) -> None:
        self._writers["blocks.jsonl"].write(asdict(record))

    def sync(self) -> None:
        for writer in self._writers.values():
            writer.sync()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
