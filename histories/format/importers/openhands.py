"""Importer for OpenHands event streams: a JSON list of events (a saved trajectory, as
OpenHands' `save_trajectory_path` and its replay tests write it), or an object whose `history`
holds that list (one instance of an evaluation's output).

Each event is an action or an observation with a `source` (user, agent, environment):

- a user `message` action is a user turn; an agent `message` action without tool-call metadata
  is an assistant turn with that text;
- an agent action with `tool_call_metadata` is the assistant turn the model returned:
  `model_response.choices[0].message` exactly (content, tool calls, any reasoning field), once
  per model response however many actions it produced, with the response's `usage` in its extra
  (OpenAI's shape, so a continuation after the fork carries per-turn usage);
- an observation with `tool_call_metadata` is the tool result (`content`) for that call;
- a `system` action is the system prompt, and its `tools`, where present, are the tool schemas;
- everything else (agent state changes, null observations, recalls) is not sent to the model
  and is counted in `provenance.skipped_events`.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, refusal
from compaction_bench.histories.format.importers.jsonlines import strip_suffixes
from compaction_bench.histories.format.importers.normalize import build_history, source_record

EVENT_SOURCES = ("agent", "user", "environment")


def is_openhands_events(items: list[Any]) -> bool:
    """True for a non-empty list of OpenHands events."""
    return bool(items) and all(
        isinstance(e, dict) and e.get("source") in EVENT_SOURCES
        and ("action" in e or "observation" in e) for e in items)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _assistant(event: dict[str, Any], metadata: dict[str, Any], origin: str,
               where: str) -> tuple[str, dict[str, Any]]:
    """(the model response's id, the assistant message it returned)."""
    response = _object(metadata.get("model_response"))
    choices = response.get("choices")
    message = _object(choices[0]).get("message") if isinstance(choices, list) and choices else None
    call_id = metadata.get("tool_call_id")
    if isinstance(message, dict):
        assistant = copy.deepcopy(message)
        assistant["role"] = "assistant"
        extra = {"usage": response.get("usage"), "response_id": response.get("id"),
                 "model": response.get("model")}
        assistant["extra"] = {k: v for k, v in extra.items() if v is not None}
        return str(response.get("id") or f"{where}:{call_id}"), assistant
    # No recorded model response: rebuild the one call from the action's own arguments.
    name = metadata.get("function_name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise refusal(origin, "needs model_response, or function_name and tool_call_id "
                      "(save the trajectory with tool-call metadata)", index=where,
                      field_name="tool_call_metadata")
    args = {k: v for k, v in _object(event.get("args")).items() if k != "thought"}
    return f"{where}:{call_id}", {
        "role": "assistant", "content": str(_object(event.get("args")).get("thought") or ""),
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)}}],
        "extra": {"rebuilt_from": "action args (no model_response recorded)"}}


def openhands_from_data(data: Any, path: str | Path, *, task: str | None = None,
                        fork: int | None = None, arm: str | None = None) -> History:
    """A parsed OpenHands event stream as a History (see the module docstring)."""
    origin = str(path)
    container = data if isinstance(data, dict) else {"history": data}
    events = container.get("history")
    if not isinstance(events, list) or not is_openhands_events(events):
        raise refusal(origin, "an OpenHands event stream is a list of events, each with "
                      "'source' and 'action' or 'observation'", field_name="history")
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    answered: set[str] = set()  # model responses already turned into an assistant message
    skipped: Counter[str] = Counter()
    for number, event in enumerate(events):
        where = f"event {number}"
        action, metadata = event.get("action"), event.get("tool_call_metadata")
        args = _object(event.get("args"))
        if action == "system":
            messages.append({"role": "system",
                             "content": str(args.get("content") or event.get("message") or "")})
            if isinstance(args.get("tools"), list):
                tools = copy.deepcopy(args["tools"])
        elif action is not None and event["source"] == "agent" and isinstance(metadata, dict):
            response_id, assistant = _assistant(event, metadata, origin, where)
            if response_id not in answered:
                answered.add(response_id)
                messages.append(assistant)
        elif action == "message" and event["source"] in ("user", "agent"):
            role = "user" if event["source"] == "user" else "assistant"
            messages.append({"role": role,
                             "content": str(args.get("content", event.get("message")) or "")})
        elif "observation" in event and isinstance(metadata, dict):
            call_id = metadata.get("tool_call_id")
            if not isinstance(call_id, str):
                raise refusal(origin, "missing: an observation of a tool call names the call",
                              index=where, field_name="tool_call_metadata.tool_call_id")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": str(event.get("content") or ""),
                             "extra": {"observation": event.get("observation")}})
        else:
            skipped[str(action or event.get("observation"))] += 1
    info = {k: v for k, v in container.items() if k != "history"}
    provenance = {"source_format": "openhands-events", "events": len(events),
                  "skipped_events": dict(sorted(skipped.items())),
                  "model": next((m["extra"].get("model") for m in messages
                                 if isinstance(m.get("extra"), dict)
                                 and m["extra"].get("model")), None)}
    name = task or str(container.get("instance_id") or "") or strip_suffixes(path)
    return build_history(messages, origin=origin, task=name, arm=arm or "clean", fork=fork,
                         source=source_record("openhands", path),
                         info={"openhands": info} if info else None, provenance=provenance,
                         tools=tools)
