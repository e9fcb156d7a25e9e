"""Recorded histories as a background user's schedule of turns (pure: no I/O beyond loading
files).

A history's full recorded run is `messages + continuation`. Request k sends every message
before the k-th assistant turn (wire form, see `wire_messages`) with
- `max_tokens` = that turn's recorded completion tokens (`extra.usage.completion_tokens`); else
  the recorded reply's length estimated at `chars_per_token` (reasoning + content + tool-call
  arguments; the prefork turns of the study files carry no usage); else `default_max_tokens`;
  and `ignore_eos: true`, so the server generates exactly that many tokens;
- a tool gap after it: `extra.tool_gap_s` when recorded, else `default_tool_gap_s` (the study
  files record no tool timings);
- a planned duration: a fixed pace where one is set (tokens / `pace_tokens_per_s`); else the
  turn's recorded `extra.wall_seconds`; else the server's measured service time
  (`measured_ttft_s` + tokens / `measured_tokens_per_s`); else `default_request_s`.

Context cap: when the estimated prompt plus `max_tokens` plus a margin exceeds `max_model_len`,
the oldest turns are dropped from the start (system and first user message kept; an assistant
turn goes together with its tool results, so tool-call pairing stays valid), then `max_tokens`
is cut to fit. The shipped study histories fit cpu-tiny's 8192 tokens without truncation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, HistoryError, load_history
from compaction_bench.histories.format.reasoning import inline_thought
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.wire import ReplayOptions


@dataclass(frozen=True)
class Turn:
    """One planned background request."""

    history: str
    turn: int  # assistant turn number in the recorded run, from 0
    payload: dict[str, Any]  # the chat request body (stream fields are added by the client)
    max_tokens: int
    max_tokens_source: str  # recorded | estimated | default | cap (a setting) | capped (room)
    gap_s: float
    planned_s: float
    planned_source: str  # pace | recorded | measured | default
    dropped_messages: int
    prompt_tokens_estimate: int


def load_schedules(paths: list[str] | list[Path], options: ReplayOptions, *, model: str,
               max_model_len: int) -> list[list[Turn]]:
    """One schedule per history file; a history without assistant turns is refused."""
    schedules = []
    for path in paths:
        schedule = schedule_history(load_history(path), str(path), options, model=model,
                                    max_model_len=max_model_len)
        if not schedule:
            raise HistoryError(f"{path}: no assistant turn to replay as background load")
        schedules.append(schedule)
    return schedules


def schedule_history(history: History, name: str, options: ReplayOptions, *, model: str,
                 max_model_len: int) -> list[Turn]:
    """The schedule of one history for `model` on a server with `max_model_len` tokens."""
    full = list(history.messages) + list(history.continuation)
    turns: list[Turn] = []
    for index, message in enumerate(full):
        if message.get("role") != "assistant":
            continue
        extra = message.get("extra") or {}
        max_tokens, source = _recorded_tokens(message, extra, options)
        if options.max_completion_tokens and max_tokens > options.max_completion_tokens:
            max_tokens, source = options.max_completion_tokens, "cap"
        wire = wire_messages(full[:index], options)
        tools = history.tools if options.send_tools and history.tools else None
        wire, dropped, estimate = _fit(wire, tools, max_tokens, max_model_len, options)
        room = max_model_len - estimate - options.prompt_margin_tokens
        if max_tokens > room:
            max_tokens, source = max(1, room), "capped"
        payload: dict[str, Any] = {"model": model, "messages": wire,
                                   **dialect.length(max_tokens), **options.extra_body}
        if tools:
            payload["tools"] = tools
        planned, planned_source = _planned(extra, max_tokens, options)
        gap = extra.get("tool_gap_s")
        turns.append(Turn(history=name, turn=len(turns), payload=payload, max_tokens=max_tokens,
                          max_tokens_source=source,
                          gap_s=float(gap) if gap is not None else options.default_tool_gap_s,
                          planned_s=planned, planned_source=planned_source,
                          dropped_messages=dropped,
                          prompt_tokens_estimate=estimate))
    return turns


def _planned(extra: dict[str, Any], max_tokens: int, options: ReplayOptions
             ) -> tuple[float, str]:
    """A turn's planned duration and where it came from (see the module docstring)."""
    if options.pace_tokens_per_s:
        return max_tokens / options.pace_tokens_per_s, "pace"
    recorded = extra.get("wall_seconds")
    if isinstance(recorded, int | float) and recorded > 0:
        return float(recorded), "recorded"
    if options.measured_tokens_per_s:
        return (options.measured_ttft_s or 0.0) + max_tokens / options.measured_tokens_per_s, (
            "measured")
    return options.default_request_s, "default"


def _recorded_tokens(message: dict[str, Any], extra: dict[str, Any],
                     options: ReplayOptions) -> tuple[int, str]:
    usage = extra.get("usage") or {}
    if isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] > 0:
        return usage["completion_tokens"], "recorded"
    chars = len(message.get("content") or "") + len(message.get("reasoning") or "")
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        chars += len(function.get("name") or "") + len(function.get("arguments") or "")
    if chars:
        return max(1, math.ceil(chars / options.chars_per_token)), "estimated"
    return options.default_max_tokens, "default"


def wire_messages(messages: list[dict[str, Any]], options: ReplayOptions) -> list[dict[str, Any]]:
    """Messages as sent: `extra` dropped, reasoning and tool calls per `options`. Every tool call
    goes as a function call, a freeform one too (histories/format/freeform.py says why)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        wire: dict[str, Any] = {"role": role, "content": content}
        reasoning = message.get("reasoning") if role == "assistant" else None
        if reasoning and options.reasoning == "keep":
            wire["reasoning"] = reasoning
        elif reasoning and options.reasoning == "inline":
            wire["content"] = inline_thought(reasoning, content)
        calls = message.get("tool_calls")
        if calls and options.tool_calls == "keep":
            wire["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                for c in calls]
        elif calls:
            text = "\n".join(f"<tool_call>{json.dumps(c['function'], ensure_ascii=False)}"
                             "</tool_call>" for c in calls)
            wire["content"] = f"{wire['content'] or ''}\n{text}".lstrip("\n")
        if role == "tool" and options.tool_calls == "keep":
            wire["tool_call_id"] = message["tool_call_id"]
            if message.get("name"):
                wire["name"] = message["name"]
        elif role == "tool":
            name = message.get("name") or "tool"
            wire = {"role": "user", "content": f"[{name} result]\n{content or ''}"}
        out.append(wire)
    return out


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    options: ReplayOptions) -> int:
    """A rough prompt length: JSON characters / chars_per_token plus 8 per message."""
    chars = len(json.dumps(messages, ensure_ascii=False)) + (
        len(json.dumps(tools)) if tools else 0)
    return math.ceil(chars / options.chars_per_token) + 8 * len(messages)


def _fit(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, max_tokens: int,
         max_model_len: int, options: ReplayOptions) -> tuple[list[dict[str, Any]], int, int]:
    """Drop the oldest turns (after system + first user) until the request fits."""
    head = 0
    for index, message in enumerate(messages):
        if message["role"] in ("system", "user") and head == index:
            head = index + 1
            if message["role"] == "user":
                break
    budget = max_model_len - options.prompt_margin_tokens - max_tokens
    kept, dropped = list(messages), 0
    estimate = estimate_tokens(kept, tools, options)
    while estimate > budget:
        # one unit: the oldest message after the head, and any tool results that follow it;
        # the last unit stays (the request must still end where the recording did)
        end = head + 1
        while end < len(kept) and kept[end]["role"] == "tool":
            end += 1
        if end >= len(kept):
            break
        dropped += end - head
        kept = kept[:head] + kept[end:]
        estimate = estimate_tokens(kept, tools, options)
    return kept, dropped, estimate
