"""Continuous compaction: the history policy of a compaction arm during a continuation.

Before each target request it compacts the reasoning blocks that are new since the last request
(Appendix D.1: every unique prior nonempty block once, cached by raw text and action name) and
returns the messages with records in their place. The agent's own message list keeps the raw
blocks; only what is sent changes. `ChatModel` times `prepare` into `rewrite_s`, apart from the
target's requests; the policy also keeps its own results and time per call, so the bench can
report postfork time with and without rewriting.

Blocks that an arm file already carries (its prefix up to the fork, compacted at the fork) are
settled and never compacted again; continuing `clean.json` with this policy instead compacts the
prefix through the cache, which yields the same records.

Every continuation pays its own rewriting by default: the cache is fresh (in memory) per policy,
so a block is rewritten once per continuation, never for free because another block or run did
it. A persistent cache is used only when asked for (`cache=`); its hits are recorded as hits.
A block whose compaction failed stays raw and is listed in `failures`: the arm's policy did not
apply, and the bench fails the arm's protocol check with that reason.

Cadence (`every`, the `<compressor>-every-<n>` arms): compaction runs only before a request that
follows a multiple of `every` assistant turns (turns n, 2n, ...), compacting every block not yet
compacted; between those requests new blocks are sent raw and earlier records stay in place.
`every=1` (the `external` and `self` arms) compacts before every request, as the study did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.compactor import (
    CompactionCache,
    CompactionResult,
    Compactor,
    CompressorConfig,
    compact_message,
)
from compaction_bench.histories.compaction.endpoint import RecordSink
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import History
from compaction_bench.histories.format.reasoning import action_name, block_text, replace_block


class ContinuousCompaction:
    """A `HistoryPolicy` that compacts new reasoning blocks before every request."""

    def __init__(self, compactor: Compactor, *, name: str, reasoning_mode: str, protocol: str,
                 settled: Iterable[tuple[int, str]] = (), task: str | None = None,
                 context: dict[str, Any] | None = None, clock: Clock = monotonic,
                 every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"compaction cadence must be at least 1 turn, got {every}")
        self.compactor = compactor
        self.every = every
        self.name = name
        self.reasoning_mode = reasoning_mode
        self.protocol = protocol
        self.task = task
        self.context = dict(context or {})  # where it runs: block, attempt (ledger lines)
        self.clock = clock
        self._settled = set(settled)
        self._done: dict[tuple[str, str], str] = {}  # (raw block, action) -> block to send
        self.results: list[CompactionResult] = []
        self.calls: list[dict[str, Any]] = []  # per prepare: time, blocks compacted

    @property
    def rewrite_s(self) -> float:
        return float(sum(c["rewrite_s"] for c in self.calls))

    @property
    def waited_s(self) -> float:
        """Time spent waiting for a compressor server to start (not rewriting: excluded)."""
        return self.compactor.waited_s

    @property
    def failures(self) -> list[CompactionResult]:
        """Blocks the compressor could not rewrite (they were sent raw)."""
        return [r for r in self.results if r.outcome == "failed"]

    def not_applied(self) -> str | None:
        """Why the policy did not apply (None: it did): every failed block, counted."""
        failed = self.failures
        if not failed:
            return None
        return (f"policy {self.name} could not apply: the compressor failed on {len(failed)} of "
                f"{len(self.results)} blocks (first: {failed[0].error})")

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to send: records in place of reasoning blocks; nothing else changes and
        `messages` itself is not mutated."""
        started = self.clock()
        waited_before = self.compactor.waited_s
        new_blocks = 0
        out = []
        turns = sum(m.get("role") == "assistant" for m in messages)
        compacting = turns % self.every == 0
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                out.append(message)
                continue
            block = block_text(message, self.reasoning_mode, self.protocol)
            if (index, block) in self._settled or not block.strip():
                out.append(message)
                continue
            key = (block, action_name(message, self.protocol))
            if key not in self._done and not compacting:
                out.append(message)  # off the cadence: sent raw until the next compaction
                continue
            if key not in self._done:
                new_blocks += 1
                sent, result = compact_message(
                    self.compactor, message, self.reasoning_mode, self.protocol,
                    context={**self.context, "task": self.task, "arm": self.name,
                             "message_index": index, "phase": "continuation",
                             "request": len(self.calls)})
                if result is not None:
                    self.results.append(result)
                # A failed block stays raw for the rest of the run (recorded once, not retried
                # before every request); the persistent cache still lacks it for a rerun.
                self._done[key] = block_text(sent, self.reasoning_mode, self.protocol)
            out.append(replace_block(message, self._done[key], self.reasoning_mode,
                                     self.protocol))
        waited = self.compactor.waited_s - waited_before
        self.calls.append({"request": len(self.calls), "new_blocks": new_blocks,
                           "rewrite_s": self.clock() - started - waited, "waited_s": waited})
        return out


def policy_for(history: History, config: CompressorConfig, *, name: str | None = None,
               cache: CompactionCache | None = None, ledger: Ledger | None = None,
               context: dict[str, Any] | None = None, on_record: RecordSink | None = None,
               origin_s: float = 0.0, seed: int | None = None,
               before_request: Callable[[], None] | None = None,
               clock: Clock = monotonic, every: int = 1) -> ContinuousCompaction:
    """The continuous-compaction policy for continuing `history` (an arm file or clean.json).

    An arm's own blocks are settled (they were compacted at the fork; with a cadence, only the
    blocks of turns up to the last multiple of `every`). The cache is fresh unless one is given;
    `ledger`, `on_record` (compressor request records), `origin_s` (the run's clock origin) and
    `context` (block, attempt) say where the rewrites are recorded."""
    settled = history.reasoning_blocks() if history.arm != "clean" else []
    settled = settled[:cadence_turns(len(settled), every)]
    compactor = Compactor(config, cache=cache if cache is not None else CompactionCache(),
                          ledger=ledger if ledger is not None else Ledger(), clock=clock,
                          on_record=on_record, origin_s=origin_s, seed=seed,
                          before_request=before_request)
    return ContinuousCompaction(
        compactor, name=name or (history.arm if history.arm != "clean" else config.name),
        reasoning_mode=history.reasoning_mode, protocol=history.action_protocol,
        settled=settled, task=history.task, context=context, clock=clock, every=every)


def cadence_turns(turns: int, every: int) -> int:
    """How many of the first `turns` assistant turns a cadence of `every` has compacted before
    the next request: those up to the last multiple of `every`."""
    return turns // every * every
