"""Importer for SWE-agent `.traj` files.

A `.traj` holds `history` (the messages the model saw, with SWE-agent's own keys such as
`agent`, `message_type`, `thought`, `action`, `is_demo`, `tool_call_ids`) and `trajectory` (one
step per action: `thought`, `action`, `observation`, `response`, `query`). `history` is used when
present, because it is exactly what the model was sent; SWE-agent's own keys are kept under
each message's extra.source_fields, and the `action` SWE-agent parsed from a text turn is kept as
`extra.recorded_action`: that fenced block is the turn's action even where the model wrote several
(SWE-agent runs the last), and the rest of the content is the turn's thought. Files with only
`trajectory` are rebuilt from the steps:
the first step's `query` gives the prompt, each step gives an assistant turn (its raw
`response`) and a user observation. Those observations are the raw tool output, not
SWE-agent's templated observation text, so prefer files with `history`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.actions import RECORDED_ACTION_KEY
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
    action = message.get("action")
    if message.get("role") == "assistant" and isinstance(action, str) and not message.get(
            "tool_calls"):
        # SWE-agent's own parse of the turn: the block it ran, found among several fences
        message["extra"] = {**message.get("extra", {}), RECORDED_ACTION_KEY: action}
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
        extra: dict[str, Any] = {"swe_agent_step": kept}
        if isinstance(step.get("action"), str):
            extra[RECORDED_ACTION_KEY] = step["action"]
        messages.append({"role": "assistant", "content": response, "extra": extra})
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
    provenance: dict[str, Any] = {"source_format": "swe-agent-traj", "built_from": built_from}
    tools = _tool_schemas(data, origin)
    if tools is None and any(m.get("tool_calls") for m in messages):
        provenance["tool_schemas"] = ("unknown: the trajectory names its tool bundles ("
                                      + ", ".join(_bundles(data)) + ") but not their schemas; "
                                      "renderings of it show no tools")
    return build_history(messages, origin=origin, task=task or instance or default_task(path),
                         arm=arm or "clean", fork=fork, source=source_record("swe-agent", path),
                         info=info, provenance=provenance, tools=tools)


def _tool_schemas(data: dict[str, Any], origin: str) -> list[dict[str, Any]] | None:
    """The OpenAI tool schemas a function-calling run was served with, where the file has them
    (a top-level `tools` list)."""
    tools = data.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise refusal(origin, "must be a list of tool schemas", field_name="tools")
    return tools


def _bundles(data: dict[str, Any]) -> list[str]:
    config = data.get("replay_config")
    if isinstance(config, str):
        with contextlib.suppress(ValueError):
            config = json.loads(config)
    agent = config.get("agent") if isinstance(config, dict) else None
    tools = agent.get("tools") if isinstance(agent, dict) else None
    bundles = tools.get("bundles") if isinstance(tools, dict) else None
    names = [str(b.get("path")) for b in bundles or [] if isinstance(b, dict)]
    return names or ["none named"]


def import_swe_agent(path: str | Path, *, task: str | None = None, fork: int | None = None,
                     arm: str | None = None) -> History:
    """Import a SWE-agent `.traj` file."""
    return sweagent_from_data(parse_json_file(path), path, task=task, fork=fork, arm=arm)
