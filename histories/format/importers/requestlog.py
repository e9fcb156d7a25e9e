"""Importer for request/response logs: one OpenAI chat request and its response per line, as a
logging proxy (or an inference server's request log) writes them for one agent run:

    {"request": {"model": ..., "messages": [...], "tools": [...], ...},
     "response": {"id": ..., "choices": [{"message": {...}, "finish_reason": ...}],
                  "usage": {"prompt_tokens": ..., "completion_tokens": ...,
                            "completion_tokens_details": {"reasoning_tokens": ...}}},
     "wall_seconds": 2.4}

Line k + 1's request must be line k's request, the assistant turn it returned (as the agent sent
it back) and what followed (tool results); a log that mixes conversations is refused. The
history is the whole recorded run cut at the fork, so every assistant turn after the fork
keeps its `usage` and `wall_seconds` in its extra: the import is a replay source (write it as
`<folder>/clean.json` and pass the folder to `records=`). `tools` come from the first request.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, refusal
from compaction_bench.histories.format.importers.jsonlines import line, strip_suffixes
from compaction_bench.histories.format.importers.normalize import build_history, source_record

SAMPLING_KEYS = ("model", "temperature", "top_p", "max_tokens", "max_completion_tokens",
                 "seed", "tool_choice", "reasoning_effort")


def is_request_log(records: list[Any]) -> bool:
    """True for a list of {request, response} objects."""
    return bool(records) and all(isinstance(r, dict) and isinstance(r.get("request"), dict)
                                 and isinstance(r.get("response"), dict) for r in records)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _checked(record: dict[str, Any], origin: str, where: str
             ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(request messages, response message, response) of one line, each field checked."""
    messages = record["request"].get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) for m in messages):
        raise refusal(origin, "must be a non-empty list of message objects", index=where,
                      field_name="request.messages")
    response = record["response"]
    choices = response.get("choices")
    message = _object(choices[0]).get("message") if isinstance(choices, list) and choices else None
    if not isinstance(message, dict):
        raise refusal(origin, "missing (log the whole response, not only its text)",
                      index=where, field_name="response.choices[0].message")
    usage = _object(response.get("usage"))
    if not all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
        raise refusal(origin, "needs integer prompt_tokens and completion_tokens (per-turn "
                      "usage is what makes the log replayable; turn usage logging on)",
                      index=where, field_name="response.usage")
    wall = record.get("wall_seconds")
    if wall is not None and (not isinstance(wall, int | float) or isinstance(wall, bool)):
        raise refusal(origin, f"{wall!r} is not a number of seconds", index=where,
                      field_name="wall_seconds")
    return messages, message, response


def _turn_extra(record: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    choice = _object(response["choices"][0])
    extra = {"usage": response["usage"], "wall_seconds": record.get("wall_seconds"),
             "response_id": response.get("id"), "model": response.get("model"),
             "finish_reason": choice.get("finish_reason")}
    return {k: v for k, v in extra.items() if v is not None}


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    """The response's message as an agent sends it back (content, reasoning, tool calls)."""
    echoed = {k: copy.deepcopy(v) for k, v in message.items()
              if k in ("content", "reasoning", "reasoning_content", "tool_calls")}
    return {"role": "assistant", **echoed}


def transcript(records: list[dict[str, Any]], origin: str) -> list[dict[str, Any]]:
    """The whole run: the first request's messages, then each turn's assistant message (with
    its usage and wall time in extra) and the messages that followed it."""
    checked = [_checked(r, origin, line(i)) for i, r in enumerate(records)]
    messages = [copy.deepcopy(m) for m in checked[0][0]]
    for number, (sent, response_message, response) in enumerate(checked):
        following = checked[number + 1][0] if number + 1 < len(checked) else None
        if following is not None and (len(following) <= len(sent)
                                      or following[: len(sent)] != sent):
            raise refusal(origin, "is not the previous request plus its response: the log "
                          "mixes conversations or reorders lines (keep one agent run per file, "
                          "in the order sent)", index=line(number + 1),
                          field_name="request.messages")
        assistant = (copy.deepcopy(following[len(sent)]) if following is not None
                     else _echo(response_message))
        if assistant.get("role") != "assistant":
            raise refusal(origin, "the message after the previous request must be the "
                          "assistant turn it returned", index=line(number + 1),
                          field_name=f"request.messages[{len(sent)}]")
        extra = assistant.get("extra")
        assistant["extra"] = {**(extra if isinstance(extra, dict) else {}),
                              **_turn_extra(records[number], response)}
        messages.append(assistant)
        if following is not None:
            messages.extend(copy.deepcopy(m) for m in following[len(sent) + 1:])
    return messages


def request_log_from_data(records: Any, path: str | Path, *, task: str | None = None,
                          fork: int | None = None, arm: str | None = None) -> History:
    """A parsed request/response log as a History (see the module docstring)."""
    origin = str(path)
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list) or not is_request_log(records):
        raise refusal(origin, "a request/response log holds one {\"request\": ..., "
                      "\"response\": ...} object per line")
    first = records[0]["request"]
    tools = first.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise refusal(origin, "must be a list of tool schemas", index=line(0),
                      field_name="request.tools")
    provenance = {"source_format": "request-log", "model": first.get("model"),
                  "sampling": {k: first[k] for k in SAMPLING_KEYS if k in first},
                  "turns_logged": len(records)}
    return build_history(transcript(records, origin), origin=origin,
                         task=task or strip_suffixes(path), arm=arm or "clean", fork=fork,
                         source=source_record("request-log", path), provenance=provenance,
                         tools=copy.deepcopy(tools))
