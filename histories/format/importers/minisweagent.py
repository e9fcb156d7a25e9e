"""Importers for mini-swe-agent trajectories (v2 "mini-swe-agent-1.1", v1 "mini-swe-agent-1")
and for plain OpenAI message lists.

A v2 trajectory that carries our top-level `extra` (what `histories.format.export` writes) keeps its
arm, task, fork, provenance, source, tools and continuation exactly, so export and re-import
give back the same history.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import (
    HISTORY_FORMAT,
    HISTORY_VERSION,
    History,
    parse_json_file,
    refusal,
)
from compaction_bench.histories.format.importers.normalize import (
    anthropic_parts,
    build_history,
    default_task,
    source_record,
)

V2_FORMAT = "mini-swe-agent-1.1"
V1_FORMAT = "mini-swe-agent-1"
# mini-swe-agent 2.x sends exactly this tool with every tool-call request (BASH_TOOL).
MSWEA_BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string",
                                       "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
_OUR_EXTRA_KEYS = {"arm", "task", "fork", "reasoning_mode", "action_protocol"}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _model_name(info: dict[str, Any]) -> Any:
    return _dict(_dict(info.get("config")).get("model")).get("model_name")


def _task_for(data: dict[str, Any], path: str | Path, task: str | None) -> str:
    return task or str(data.get("instance_id") or "") or default_task(path)


def _from_marked(data: dict[str, Any], path: str | Path, *, task: str | None,
                 fork: int | None, arm: str | None) -> History:
    """A trajectory we exported: our extra is authoritative."""
    origin = str(path)
    as_history = {"history_format": HISTORY_FORMAT, "history_version": HISTORY_VERSION,
                  "messages": data.get("messages"), "info": data.get("info", {}),
                  "extra": copy.deepcopy(data["extra"])}
    history = History.from_json(as_history, origin=origin)
    marked = history.fork.message_index if history.fork else None
    if fork is not None and fork != marked:
        raise refusal(origin, f"the file marks its fork at message {marked}; a different fork "
                      f"({fork}) would change what every arm shares (omit fork=)", index=fork,
                      field_name="fork")
    if task:
        history.task = task
    if arm:
        history.arm = arm
    return history


def _with_usage(message: Any) -> Any:
    """An assistant message with the usage of its raw response (mini-swe-agent keeps the whole
    response in `extra.response`) as `extra.usage`, where a replay reads a turn's recorded
    length."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return message
    extra = message.get("extra")
    response = extra.get("response") if isinstance(extra, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(extra, dict) or not isinstance(usage, dict) or "usage" in extra:
        return message
    return {**message, "extra": {**extra, "usage": copy.deepcopy(usage)}}


def minisweagent_from_data(data: Any, path: str | Path, *, task: str | None = None,
                           fork: int | None = None, arm: str | None = None) -> History:
    """A parsed mini-swe-agent trajectory (v1 or v2) as a History."""
    origin = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise refusal(origin, "a mini-swe-agent trajectory needs a 'messages' list",
                      field_name="messages")
    fmt = data.get("trajectory_format")
    extra = data.get("extra")
    if fmt == V2_FORMAT and isinstance(extra, dict) and set(extra) >= _OUR_EXTRA_KEYS:
        return _from_marked(data, path, task=task, fork=fork, arm=arm)
    info = _dict(data.get("info"))
    importer = "minisweagent-v2" if fmt == V2_FORMAT else "minisweagent-v1"
    messages = [_with_usage(m) for m in data["messages"]]
    provenance: dict[str, Any] = {"source_format": fmt, "model": _model_name(info)}
    history = build_history(messages, origin=origin, task=_task_for(data, path, task),
                            arm=arm or "clean", fork=fork, source=source_record(importer, path),
                            info=info, provenance=provenance)
    names = {c["function"]["name"] for m in history.messages for c in m.get("tool_calls", [])}
    if fmt == V2_FORMAT and history.action_protocol == "tool_calls" and names <= {"bash"}:
        history.tools = [copy.deepcopy(MSWEA_BASH_TOOL)]
    return history


def openai_messages_from_data(data: Any, path: str | Path, *, task: str | None = None,
                              fork: int | None = None, arm: str | None = None) -> History:
    """A JSON list of OpenAI messages, or {"messages": [...], "tools"?: [...]}, as a History."""
    origin = str(path)
    container = data if isinstance(data, dict) else {"messages": data}
    tools = container.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise refusal(origin, "must be a list of tool schemas", field_name="tools")
    messages, converted = anthropic_parts(container.get("messages"), origin)
    provenance = {"source_format": "openai-messages", "model": container.get("model")}
    if converted:
        provenance["anthropic_parts"] = converted
    return build_history(messages, origin=origin,
                         task=_task_for(container, path, task), arm=arm or "clean", fork=fork,
                         source=source_record("openai-messages", path),
                         provenance=provenance, tools=tools)


def import_minisweagent_v2(path: str | Path, *, task: str | None = None,
                           fork: int | None = None, arm: str | None = None) -> History:
    """Import a mini-swe-agent 2.x `.traj.json` (tool-call or text-based)."""
    data = parse_json_file(path)
    if not isinstance(data, dict) or data.get("trajectory_format") != V2_FORMAT:
        raise refusal(str(path), f"expected trajectory_format {V2_FORMAT!r}",
                      field_name="trajectory_format")
    return minisweagent_from_data(data, path, task=task, fork=fork, arm=arm)


def import_minisweagent_v1(path: str | Path, *, task: str | None = None,
                           fork: int | None = None, arm: str | None = None) -> History:
    """Import a mini-swe-agent 1.x `.traj.json` (fenced bash actions, user observations)."""
    data = parse_json_file(path)
    if not isinstance(data, dict) or data.get("trajectory_format") != V1_FORMAT:
        raise refusal(str(path), f"expected trajectory_format {V1_FORMAT!r}",
                      field_name="trajectory_format")
    return minisweagent_from_data(data, path, task=task, fork=fork, arm=arm)


def import_openai_messages(path: str | Path, *, task: str | None = None,
                           fork: int | None = None, arm: str | None = None) -> History:
    """Import a plain OpenAI message list (a list, or an object with `messages`)."""
    return openai_messages_from_data(parse_json_file(path), path, task=task, fork=fork, arm=arm)
