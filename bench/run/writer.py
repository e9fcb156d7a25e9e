"""The run folder's writer: records appended as they happen, on the run's clock.

Safe across threads (the arms) and processes: locust appends background requests to the same
`requests.jsonl`, so every line goes out in one O_APPEND write (`common.files.JsonlWriter`).
`sync()` fsyncs every file (the bench calls it at block ends).

Two ways a run ends early show here. `cancel()` (the run is stopping): arm and block records
that arrive afterwards are dropped and counted, never written as results of a cut attempt;
request records are still appended (what was on the wire, labelled with its abort). A record
that cannot be written (a full disk): the error is kept in `failure`, `on_failure` is called
once (the bench stops the run), and nothing is raised into the arm threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from compaction_bench.common.files import JsonlWriter, RecordWriteError
from compaction_bench.transport.client import RequestRecord

FILES = ("requests.jsonl", "arms.jsonl", "blocks.jsonl")


class RunWriter:
    """Appends records to a run folder; times are shifted to seconds from the run's start."""

    def __init__(self, run_dir: Path, origin: float,
                 on_failure: Callable[[RecordWriteError], None] | None = None) -> None:
        self.run_dir = run_dir
        self.origin = origin
        self.on_failure = on_failure
        self.failure: RecordWriteError | None = None
        self.dropped = 0  # arm and block records that arrived after cancel()
        self._cancelled = threading.Event()
        self._writers = {name: JsonlWriter(run_dir / name) for name in FILES}

    @property
    def repaired(self) -> list[str]:
        """Files whose last line a crash had cut: it is skipped, new records start fresh."""
        return [name for name, w in self._writers.items() if w.torn_line_repaired]

    def _write(self, name: str, line: dict[str, Any]) -> None:
        try:
            self._writers[name].write(line)
        except RecordWriteError as exc:
            first = self.failure is None
            self.failure = self.failure or exc
            if first and self.on_failure is not None:
                self.on_failure(exc)

    def request(self, record: RequestRecord, **identity: Any) -> None:
        """A request record (absolute clock times) with its identity (source, regime, block,
        labels such as attempt)."""
        line = record.labelled(**identity).shifted(self.origin)
        self._write("requests.jsonl", line.to_json())

    def arm(self, record: Any) -> bool:
        """Append an arm record; False when the run is stopping (the record is dropped)."""
        if self._cancelled.is_set():
            self.dropped += 1
            return False
        self._write("arms.jsonl", asdict(record))
        return True

    def block(self, record: Any) -> bool:
        if self._cancelled.is_set():
            self.dropped += 1
            return False
        self._write("blocks.jsonl", asdict(record))
        return True

    def cancel(self) -> None:
        self._cancelled.set()

    def sync(self) -> None:
        for writer in self._writers.values():
            writer.sync()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
