"""Where a run's wall time goes outside its blocks: `phases.jsonl`, one line per stretch (the
server's start, the self-check, the service probe, a helper's lazy start, the whole invocation),
appended as each ends, on the run clock. The report's harness-overhead figures read it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compaction_bench.bench.runfolder import PHASES_FILE, SCHEMA_VERSION
from compaction_bench.common.files import append_jsonl


class PhaseLog:
    """Appends `{"phase", "started_s", "ended_s"}` lines to a run folder's phases file."""

    def __init__(self, run_dir: Path, origin: float) -> None:
        self.path = run_dir / PHASES_FILE
        self.origin = origin

    def add(self, phase: str, started: float, ended: float) -> None:
        """Record one stretch given in `time.monotonic()` seconds."""
        append_jsonl(self.path, {"schema": SCHEMA_VERSION, "phase": phase,
                                 "started_s": started - self.origin,
                                 "ended_s": ended - self.origin})

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body; recorded only when it finishes (a failed start is not a phase)."""
        started = time.monotonic()
        yield
        self.add(name, started, time.monotonic())
