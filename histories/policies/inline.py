"""In-context self-compaction, the `self-inline` arm: compaction as agent harnesses do it
(Claude Code's `/compact` and auto-compaction, Codex's compaction, goose, the OpenHands
condenser), where the study's `self` arm rewrites each raw reasoning block on its own.

At the fork, before the first postfork request, the policy sends one **compaction request**: the
agent's own history before the fork's action (the very messages the fork's action was generated
from, so a prefix the engine may still hold in its cache), then one user message with the
compaction instruction (the `inline-summary` prompt), to the target model's own served name on
the same engine, with the agent's own request settings: its tools (so the rendered prefix is the
same tokens), its cache salt and its session id (a router keeps it on the agent's replica). Tool
calls are turned off for it (`tool_choice: none`), a text action's structured output is not
forced, and its completion cap is the agent's own (`max_tokens`: 256 for cpu-tiny's text
actions, 4096 with tool calls), unless one is given. Its reply replaces that history, as the
harnesses do: from then on each request sends the kept head (the system messages and the task's
first user message), one user message carrying the summary, then the fork's action and
everything after it, unchanged. The agent's own message list keeps everything; only what is sent
changes. The compaction happens once; later turns are sent as they come (a harness compacts
again only when its context fills, which a continuation of a few turns does not reach).

The fork's action itself is not in what the compaction request sees: the pair is the same as a
log's recorded pair (`histories/format/importers/compaction.py`), where the first action after
the boundary is the fork. Recorded: the compaction request's record (source
`<arm>/compressor` in requests.jsonl: prompt, cached and completion tokens, times) through
`on_record`, and kept as `record`, whose token counts the bench writes into the attempt's record
(`rewrite_record`). The request's time falls inside
`prepare`, which the continuation times as rewrite time, apart from postfork time. A failed or
empty compaction raises `InlineCompactionError`: the attempt fails with the reason, and nothing
is sent raw in its place.

Unbound (no model to send through: the invariant check builds the first request before the
block runs), `prepare` puts `UNBOUND_SUMMARY` where the summary goes, so the check can hold the
request's shape to clean's (`check_replaced`); after the run the request really sent is held to
the same check.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.compaction.endpoint import RecordSink
from compaction_bench.histories.compaction.prompts import load_prompt
from compaction_bench.histories.format.invariant import InvariantError
from compaction_bench.transport.client import RequestRecord, Response, prepare

INLINE_PROMPT = "inline-summary"
SUMMARY_HEADER = ("This session continues from an earlier part of the conversation, which was "
                  "compacted. Your own summary of it:\n\n")
UNBOUND_SUMMARY = "(the summary the compaction request returns)"


class InlineCompactionError(SuiteError):
    """The compaction request failed or returned no summary; the attempt cannot continue."""


class Sender(Protocol):
    """What the policy sends through: the agent's own model (histories.agent.chat.ChatModel)."""

    config: Any
    client: Any

    def api_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def request_body(self, messages: list[dict[str, Any]], *,
                     index: int | None = None) -> dict[str, Any]: ...


def kept_head(messages: list[dict[str, Any]]) -> int:
    """How many leading messages a compaction keeps: the system messages, then the task's first
    user message."""
    kept = 0
    while kept < len(messages) and messages[kept].get("role") == "system":
        kept += 1
    if kept < len(messages) and messages[kept].get("role") == "user":
        kept += 1
    return kept


class InlineCompaction:
    """A `HistoryPolicy` that compacts the history before the fork's action in context, once."""

    def __init__(self, *, name: str, fork_index: int, max_tokens: int | None = None,
                 on_record: RecordSink | None = None, prompt: str = INLINE_PROMPT) -> None:
        self.name = name
        self.fork_index = fork_index
        self.max_tokens = max_tokens
        self.on_record = on_record
        self.prompt = load_prompt(prompt)
        self.model: Sender | None = None
        self.summary: str | None = None
        self.record: RequestRecord | None = None  # the one compaction request, as it went
        self.error: str | None = None

    def bind(self, model: Sender) -> None:
        """The agent's model: the compaction request goes out through it (its settings)."""
        self.model = model

    def head(self, messages: list[dict[str, Any]]) -> int:
        kept = kept_head(messages[: self.fork_index])
        if kept >= self.fork_index:
            raise InlineCompactionError(
                f"arm {self.name}: nothing before the fork's action (message {self.fork_index}) "
                "but the system and task messages, so there is nothing to compact; fork the "
                "history later (`compaction-bench histories import ... --fork N`)")
        return kept

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to send: the kept head, the summary, the fork's action and on."""
        if len(messages) <= self.fork_index:
            raise InlineCompactionError(f"arm {self.name}: asked to prepare {len(messages)} "
                                        f"messages, before the fork (message {self.fork_index})")
        kept = self.head(messages)
        if self.summary is None:
            if self.model is None:
                return self._replaced(messages, kept, UNBOUND_SUMMARY)
            self.summary = self._compact(self.model, messages[: self.fork_index])
        return self._replaced(messages, kept, self.summary)

    def _replaced(self, messages: list[dict[str, Any]], kept: int,
                  summary: str) -> list[dict[str, Any]]:
        return [*messages[:kept], {"role": "user", "content": SUMMARY_HEADER + summary},
                *messages[self.fork_index:]]

    def _compact(self, model: Sender, history: list[dict[str, Any]]) -> str:
        wire = [*model.api_messages(history), {"role": "user", "content": self.prompt.text}]
        body = model.request_body(wire)
        body.pop("structured_outputs", None)  # a summary, not a forced action
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if "tools" in body:
            body["tool_choice"] = "none"  # the same tools (the same prefix), none called
        config = model.config
        request = prepare(config.api_url, body, request_id=uuid.uuid4().hex,
                          api_key=config.api_key, session_id=config.session_id)
        response: Response = model.client.send(request)
        record = response.record.labelled(body_sha256=request.body_sha256, phase="compaction",
                                          prompt=self.prompt.name)
        if self.on_record is not None:
            self.on_record(record)
        summary = response.content.strip()
        self.record = record
        if not record.ok:
            self.error = f"the compaction request failed: {record.error}"
        elif not summary:
            self.error = (f"the compaction request returned no summary (finish reason "
                          f"{record.finish_reason}, {record.completion_tokens} tokens)")
        if self.error is not None:
            raise InlineCompactionError(f"arm {self.name}: {self.error}")
        return summary

    def not_applied(self) -> str | None:
        """Why the policy did not apply (None: it did)."""
        return None if self.error is None else f"policy {self.name}: {self.error}"

    def rewrite_record(self) -> dict[str, Any]:
        """The attempt record's rewrite fields: one compaction request (or none, when the
        continuation never reached its first request)."""
        r = self.record
        if r is None:
            return {"rewrite_requests": 0}
        return {"rewrite_requests": 1, "rewrite_cache_hits": 0,
                "rewrite_prompt_tokens": r.prompt_tokens,
                "rewrite_cached_tokens": r.cached_tokens,
                "rewrite_completion_tokens": r.completion_tokens,
                "rewrite_failed_blocks": int(self.error is not None)}


def check_tail(clean: dict[str, Any], arm: dict[str, Any], *, arm_name: str,
               ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The invariant of an arm whose history before the fork's action was replaced by a
    compaction it does not control (the `recorded` arm: the agent's own, from its log), on two
    first postfork request bodies: every field but `messages` equal, and the messages from the
    last assistant message (the fork's action) on equal; the history before it differs. Raises
    `InvariantError` naming the first difference; returns the report."""
    _same_fields(clean, arm, arm_name=arm_name, ignore=ignore)
    was, now = list(clean.get("messages") or []), list(arm.get("messages") or [])
    fork_was, fork_now = _last_assistant(was), _last_assistant(now)
    if fork_was is None or fork_now is None:
        raise InvariantError(f"arm {arm_name}: a first postfork request without the fork's "
                             "action (no assistant message)")
    if now[fork_now:] != was[fork_was:]:
        raise InvariantError(f"arm {arm_name}: the fork's action and what follows it differ "
                             "from clean's")
    if now[:fork_now] == was[:fork_was]:
        raise InvariantError(f"arm {arm_name}: the history before the fork's action is "
                             "clean's: nothing was compacted")
    return {"passed": True, "clean_messages_before_the_fork": fork_was,
            "arm_messages_before_the_fork": fork_now}


def _last_assistant(messages: list[dict[str, Any]]) -> int | None:
    found = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    return found[-1] if found else None


def _same_fields(clean: dict[str, Any], arm: dict[str, Any], *, arm_name: str,
                 ignore: tuple[str, ...]) -> None:
    for key in sorted(set(clean) | set(arm)):
        if key in ("messages", *ignore):
            continue
        if clean.get(key) != arm.get(key):
            raise InvariantError(f"arm {arm_name}: field {key!r} of the first postfork request "
                                 "differs from clean's (a compaction changes the messages only)")


def check_replaced(clean: dict[str, Any], arm: dict[str, Any], *, arm_name: str,
                   fork_index: int, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The invariant of an in-context compaction arm, on two first postfork request bodies:
    every field but `messages` (and the `ignore`d factor fields) equal; the arm's messages are
    clean's kept head, one user message (the summary), then clean's messages from the fork's
    action on, unchanged. Raises `InvariantError` naming the first difference; returns the
    report."""
    _same_fields(clean, arm, arm_name=arm_name, ignore=ignore)
    was, now = list(clean.get("messages") or []), list(arm.get("messages") or [])
    kept = kept_head(was[:fork_index])
    tail = was[fork_index:]
    if len(now) != kept + 1 + len(tail):
        raise InvariantError(f"arm {arm_name}: the first postfork request has {len(now)} "
                             f"messages; expected the {kept} kept, the summary and the "
                             f"{len(tail)} from the fork's action on")
    if now[:kept] != was[:kept]:
        raise InvariantError(f"arm {arm_name}: the kept system and task messages differ from "
                             "clean's")
    summary = now[kept]
    if summary.get("role") != "user" or not str(summary.get("content") or "").startswith(
            SUMMARY_HEADER):
        raise InvariantError(f"arm {arm_name}: message {kept} is not the summary (a user "
                             "message that starts with the compaction's header)")
    if now[kept + 1:] != tail:
        raise InvariantError(f"arm {arm_name}: the fork's action and what follows it differ "
                             "from clean's")
    return {"passed": True, "kept_messages": kept, "replaced_messages": fork_index - kept,
            "summary_chars": len(str(summary.get("content") or "")) - len(SUMMARY_HEADER)}

