"""The rewrite ledger: one JSON line per compaction call, appended as it happens.

Raw records first: a line is written (flushed and fsynced) the moment a block's outcome is
known, so a crash loses at most the block in flight, and lines already written are never
rewritten. Summaries (words removed, rewrite time, cost per arm) are computed from the lines.

Compaction calls write `LedgerEntry` lines; the other history policies (entropy pruning,
deletion, random removal: `histories.policies.edits.PolicyEdit`) write their own lines, marked
`"kind": "policy"`, to the same ledger, so one file holds every change an arm made.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from compaction_bench.common.files import append_jsonl, read_jsonl

Outcome = Literal["rewritten", "identity-short", "reverted-not-shorter", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("rewritten", "identity-short", "reverted-not-shorter", "failed")


@dataclass(frozen=True)
class LedgerEntry:
    """One compaction call. Times: `at` is wall-clock epoch seconds (for ordering across
    processes), `t_s` the run's clock (seconds since the run's start; since the compactor's
    clock origin outside a run), `latency_s` monotonic seconds spent in compressor requests (0 on
    a cache hit or an identity block). Token counts sum over the call's drafts; None where the
    endpoint did not report them. `cost` is None unless a price per token is configured.
    `context` names where the call happened (task, arm, block, attempt, message index, phase)."""

    at: float
    t_s: float
    block_sha256: str
    action: str
    compressor: str
    prompt: str
    prompt_sha256: str
    words_in: int
    words_out: int
    outcome: Outcome
    latency_s: float
    drafts: int
    cache_hit: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost: float | None
    redactions: int
    repaired: bool
    missing_required: list[str]
    error: str | None
    context: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LedgerLine(Protocol):
    """What a ledger holds: a record with an outcome that turns into one JSON line."""

    @property
    def outcome(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


class Ledger:
    """Append-only JSONL file (or memory only, with `path=None`). Safe to share between
    threads of one process; several processes may append to one file (one write per line)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: list[LedgerLine] = []
        self._lock = threading.Lock()

    def append(self, entry: LedgerLine) -> None:
        with self._lock:
            self.entries.append(entry)
            if self.path is not None:
                append_jsonl(self.path, entry.to_json())


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a ledger file (a torn last line from a crash is skipped)."""
    return read_jsonl(path).objects
