"""Importer for SWE-agent `.traj` files.

A `.traj` holds `history` (the messages the model saw, with SWE-agent's own keys such as
`agent`, `message_type`, `thought`, `action`, `is_demo`, `tool_call_ids`) and `trajectory` (one
step per action: `thought`, `action`, `observation`, `response`, `query`). `history` is used when
present, because it is exactly what the model was sent; SWE-agent's own keys are kept under
each message's extra.source_fields. Files with only `trajectory` are rebuilt from the steps:
the first step's `query` gives the prompt, each step gives an assistant turn (its raw
`response`) and a user observation. Those observations are the raw tool output, not
SWE-agent's templated observation text, so prefer files with `history`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, parse_json_file, refusal
from compaction_bench.histories.format.importers.normalize import (
    build_history,
    default_task,
    source_record,
)


def _history_message(item: dict[str, Any]) -> dict[str, Any]:
    message = dict(item)
    ids = message.pop("tool_call_ids", None)
    if message.get("role") == "tool" and "tool_call_id" not in message and ids:
        # validation refuses an id that is not a string, naming the field
        message["tool_call_id"] = ids[0] if isinstance(ids, list) else ids
    elif ids is not None and isinstance(message.setdefault("extra", {}), dict):
        message["extra"] = {**message["extra"], "tool_call_ids": ids}
    blocks = message.pop("thinking_blocks", None)
    if isinstance(blocks, list) and not message.get("reasoning"):
        texts = [b.get("thinking") for b in blocks if isinstance(b, dict)]
        message["reasoning"] = "\n".join(t for t in texts if isinstance(t, str))
    return message


def _steps_to_messages(steps: list[Any], origin: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    query = steps[0].get("query") if steps and isinstance(steps[0], dict) else None
    if isinstance(query, list):
        messages.extend(_history_message(m) for m in query if isinstance(m, dict))
    for number, step in enumerate(steps):
        if not isinstance(step, dict):
            raise refusal(origin, "must be an object", field_name=f"trajectory[{number}]")
        response = step.get("response")
        if not isinstance(response, str) or not response:
            response = f"{step.get('thought') or ''}\n\n```\n{step.get('action') or ''}\n```"
        kept = {k: step[k] for k in ("thought", "action", "execution_time", "state")
                if k in step}
        messages.append({"role": "assistant", "content": response,
                         "extra": {"swe_agent_step": kept}})
        if step.get("observation") is not None:
            messages.append({"role": "user", "content": str(step["observation"])})
    return messages


def sweagent_from_data(data: Any, path: str | Path, *, task: str | None = None,
                       fork: int | None = None, arm: str | None = None) -> History:
    """A parsed SWE-agent `.traj` as a History (see the module docstring)."""
    origin = str(path)
    if not isinstance(data, dict):
        raise refusal(origin, "a SWE-agent .traj is a JSON object")
    history_items = data.get("history")
    steps = data.get("trajectory")
    if isinstance(history_items, list) and history_items:
        if not all(isinstance(m, dict) for m in history_items):
            raise refusal(origin, "must be a list of message objects", field_name="history")
        messages = [_history_message(m) for m in history_items]
        built_from = "history"
    elif isinstance(steps, list) and steps:
        messages = _steps_to_messages(steps, origin)
        built_from = "trajectory"
    else:
        raise refusal(origin, "neither 'history' nor 'trajectory' holds any entries",
                      field_name="history")
    raw_info = data.get("info")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    instance = str(info.get("instance_id") or "")
    return build_history(messages, origin=origin, task=task or instance or default_task(path),
                         arm=arm or "clean", fork=fork, source=source_record("swe-agent", path),
                         info=info,
                         provenance={"source_format": "swe-agent-traj", "built_from": built_from})


def import_swe_agent(path: str | Path, *, task: str | None = None, fork: int | None = None,
                     arm: str | None = None) -> History:
    """Import a SWE-agent `.traj` file."""
    return sweagent_from_data(parse_json_file(path), path, task=task, fork=fork, arm=arm)
