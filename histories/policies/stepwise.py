"""The online history policy of the second paper's arms (ICLR, Section 3.1): before each request,
every assistant step completed since the last one is decided once by a rule
(`histories.policies.rules`), and the decision stays in the history for every later request.

The agent's own message list keeps the raw turns; `prepare` returns what is sent: earlier
decisions in place, new steps decided now, each conditioned on the history before it as sent
(earlier steps already edited), which is what online write-back means. Only the editable
reasoning changes (`histories.policies.segments`): system, user, action, tool-call and
observation messages are passed through untouched, and `messages` is never mutated.

`defer_latest` (keep-latest) leaves the most recent step as it is and decides it once a later
step exists. Steps an arm file already carries (decided when the arm was written at the fork)
are `settled` and passed through. A rule that raises leaves its step unchanged, is recorded as
`failed`, and `not_applied` makes the bench fail the arm's protocol check (as a compressor
failure does). Every decision is one `PolicyEdit` line in the ledger; `ChatModel` times
`prepare` into the continuation's `rewrite_s`, so scorer time is charged to the arm.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Any, Protocol

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.compaction.lexical import count_words
from compaction_bench.histories.policies.edits import PolicyEdit
from compaction_bench.histories.policies.rules import Decision, Step
from compaction_bench.histories.policies.scorer import ProxyTokenizer
from compaction_bench.histories.policies.segments import reasoning_span, with_reasoning


class Rule(Protocol):
    rule: str

    def decide(self, step: Step) -> Decision: ...


class StepwisePolicy:
    """A `HistoryPolicy` applying one rule to each completed step, once (module docstring)."""

    def __init__(self, rule: Rule, *, name: str, reasoning_mode: str, protocol: str,
                 settled: Iterable[int] = (), defer_latest: bool = False,
                 ledger: Ledger | None = None, tokenizer: ProxyTokenizer | None = None,
                 context: dict[str, Any] | None = None, clock: Clock = monotonic,
                 origin_s: float = 0.0) -> None:
        self.rule = rule
        self.name = name
        self.reasoning_mode = reasoning_mode
        self.protocol = protocol
        self.settled = set(settled)
        self.defer_latest = defer_latest
        self.ledger = ledger if ledger is not None else Ledger()
        self.tokenizer = tokenizer
        self.context = dict(context or {})
        self.clock = clock
        self.origin_s = origin_s
        self.waited_s = 0.0  # nothing starts on first use (the scorer loads before the block)
        self._done: dict[tuple[int, str], dict[str, Any]] = {}  # (index, raw sha) -> sent
        self.edits: list[PolicyEdit] = []
        self.calls: list[dict[str, Any]] = []

    @property
    def decided(self) -> list[int]:
        """Message indices this policy has decided (an arm file's settled steps)."""
        return sorted({index for index, _ in self._done})

    @property
    def scorer_s(self) -> float:
        return float(sum(e.scorer_s for e in self.edits))

    def not_applied(self) -> str | None:
        failed = [e for e in self.edits if e.outcome == "failed"]
        if not failed:
            return None
        return (f"policy {self.name} could not apply: its {self.rule.rule} rule failed on "
                f"{len(failed)} of {len(self.edits)} steps (first: {failed[0].error})")

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to send (module docstring)."""
        started = self.clock()
        assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        latest = assistants[-1] if assistants and self.defer_latest else None
        out: list[dict[str, Any]] = []
        new = 0
        for index, message in enumerate(messages):
            if message.get("role") != "assistant" or index in self.settled or index == latest:
                out.append(message)
                continue
            span = reasoning_span(message, self.reasoning_mode, self.protocol)
            key = (index, hashlib.sha256(span.block.encode()).hexdigest())
            if key not in self._done:
                new += 1
                self._done[key] = self._decide(index, message, span, list(out), key[1])
            out.append(self._done[key])
        self.calls.append({"request": len(self.calls), "new_steps": new,
                           "prepare_s": self.clock() - started})
        return out

    def _decide(self, index: int, message: dict[str, Any], span: Any,
                before: list[dict[str, Any]], sha: str) -> dict[str, Any]:
        step = Step(index=index, span=span, before=before, reasoning_mode=self.reasoning_mode,
                    protocol=self.protocol)
        try:
            decision = self.rule.decide(step)
            sent = with_reasoning(message, span, decision.text, self.reasoning_mode,
                                  self.protocol)
        except Exception as exc:  # the per-step boundary: recorded, the step sent as it was
            decision, sent = Decision(span.text, "failed",
                                      error=f"{type(exc).__name__}: {exc}"), message
        self._record(index, span.text, decision, sha)
        return sent

    def _tokens(self, text: str) -> int | None:
        return self.tokenizer.count(text) if self.tokenizer is not None else None

    def _record(self, index: int, raw: str, decision: Decision, sha: str) -> None:
        scores = decision.scores
        edit = PolicyEdit(
            at=time.time(), t_s=self.clock() - self.origin_s, policy=self.name,
            rule=self.rule.rule, message_index=index, outcome=decision.outcome,
            block_sha256=sha, words_in=count_words(raw), words_out=count_words(decision.text),
            tokens_in=self._tokens(raw), tokens_out=self._tokens(decision.text),
            segments=decision.segments, removed_segments=list(decision.removed_segments),
            segment_entropy=list(decision.segment_entropy),
            removed_tokens=decision.removed_tokens, seed=decision.seed,
            scorer_s=scores.scorer_s if scores else 0.0,
            scorer_tokens=scores.input_tokens if scores else 0,
            queued_s=scores.queued_s if scores else 0.0,
            device=scores.device if scores else None,
            tokenizer=self.tokenizer.source if self.tokenizer is not None else None,
            error=decision.error,
            context={**self.context, "message_index": index, "request": len(self.calls)})
        self.edits.append(edit)
        self.ledger.append(edit)


def edit_totals(edits: list[PolicyEdit]) -> dict[str, Any]:
    """Per-arm sums over its decisions: counts per outcome, words, tokens, scorer cost."""
    out: dict[str, Any] = {"steps": len(edits)}
    for edit in edits:
        out[edit.outcome] = out.get(edit.outcome, 0) + 1
    for name in ("words_in", "words_out", "scorer_s", "scorer_tokens", "queued_s"):
        out[name] = sum(getattr(e, name) for e in edits)
    for name in ("tokens_in", "tokens_out"):
        values = [getattr(e, name) for e in edits if getattr(e, name) is not None]
        out[name] = sum(values) if values else None
    out["scorer_calls"] = sum(e.scorer_tokens > 0 for e in edits)
    out["devices"] = sorted({e.device for e in edits if e.device})
    return out
