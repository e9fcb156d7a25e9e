"""The history file: one agent run's messages up to a fork, with its arm, task and provenance.

A history file is a superset of mini-swe-agent's `.traj.json` (trajectory_format
"mini-swe-agent-1.1"): `messages` in OpenAI chat form and `info` as mini-swe-agent writes them,
plus our own top-level `extra` (arm, task, fork, provenance, ...). mini-swe-agent's inspector
reads `messages` only, so it opens our files as they are.

Contract:
- `load_history` validates everything and refuses with `HistoryError`, whose text names the file,
  the message index and the field, and says what would be accepted.
- `save_history` validates first, then writes atomically (`common.files`: temp file in the same
  folder, fsync, `os.replace`, mode 0644): a crash leaves the old file or the new one, never
  half a file.
- A history's messages end at its fork: the assistant turn whose action is requested and whose
  result is not yet shown. What came after it in a recorded run (the pending result, later turns)
  may be kept in `continuation`, which is never sent as history.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import RecordWriteError
from compaction_bench.common.files import write_json_atomic as _write_json
from compaction_bench.histories.format.actions import message_text_action
from compaction_bench.histories.format.reasoning import block_text

HISTORY_FORMAT = "compaction-bench-history"
HISTORY_VERSION = 1
SUPPORTED_VERSIONS = (1,)
TRAJECTORY_FORMAT = "mini-swe-agent-1.1"
ROLES = ("system", "user", "assistant", "tool", "exit")
REASONING_MODES = ("native", "tagged-visible")
ACTION_PROTOCOLS = ("tool_calls", "text")


class HistoryError(SuiteError):
    """A history (or a file to import) was refused. The text names file, message index, field."""


def refusal(origin: str, problem: str, *, index: int | str | None = None,
            field_name: str | None = None) -> HistoryError:
    """Build a `HistoryError` in the one shape every refusal uses."""
    parts = [origin]
    if index is not None:
        parts.append(index if isinstance(index, str) else f"message {index}")
    if field_name is not None:
        parts.append(f"field '{field_name}'")
    parts.append(problem)
    return HistoryError(": ".join(parts))


@dataclass
class Fork:
    """The pending action at the end of a history, and the result every arm receives after it."""

    message_index: int
    action: dict[str, Any]
    pending_result: str | None = None


@dataclass
class History:
    """One arm's history of one task. See the module docstring for the file layout."""

    messages: list[dict[str, Any]]
    task: str
    arm: str = "clean"
    reasoning_mode: str = "native"
    action_protocol: str = "tool_calls"
    fork: Fork | None = None
    info: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] | None = None
    # Additions to the first contract, both optional: the tool schemas the run was served with
    # (needed to render tool-call histories), and the recorded messages after the fork.
    tools: list[dict[str, Any]] | None = None
    continuation: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object (every key always present)."""
        return {
            "trajectory_format": TRAJECTORY_FORMAT,
            "history_format": HISTORY_FORMAT,
            "history_version": HISTORY_VERSION,
            "messages": self.messages,
            "info": self.info,
            "extra": {
                "arm": self.arm,
                "task": self.task,
                "reasoning_mode": self.reasoning_mode,
                "action_protocol": self.action_protocol,
                "fork": asdict(self.fork) if self.fork is not None else None,
                "provenance": self.provenance,
                "source": self.source,
                "tools": self.tools,
                "continuation": self.continuation,
            },
        }

    @classmethod
    def from_json(cls, data: Any, *, origin: str) -> History:
        """Validate a parsed history file; `origin` (usually the path) prefixes every refusal."""
        return _validate_history_json(data, origin=origin)

    def reasoning_blocks(self) -> list[tuple[int, str]]:
        """(message index, reasoning block) of every assistant turn, in order, as
        `histories.format.reasoning.block_text` defines the block ("" where a turn has none)."""
        return [(index, block_text(message, self.reasoning_mode, self.action_protocol))
                for index, message in enumerate(self.messages)
                if message.get("role") == "assistant"]

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of messages and fork: identifies what a history sends.
        Arms of one task differ in it only through assistant reasoning."""
        payload = {"messages": self.messages,
                   "fork": asdict(self.fork) if self.fork is not None else None}
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: the text every hash in this package is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_action(message: dict[str, Any], protocol: str) -> dict[str, Any] | None:
    """The action an assistant message requests, or None when it requests none (or several).

    tool_calls: exactly one tool call; `command` is the bash command for a `bash` tool and the
    raw arguments JSON otherwise. text: exactly one fenced action block, or the block holding the
    action the agent recorded (`actions.action_fence`).
    """
    if message.get("role") != "assistant":
        return None
    if protocol == "text":
        split = message_text_action(message)
        return {"command": split[1]} if split else None
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or not isinstance(calls[0], dict):
        return None
    call = calls[0]
    function = call.get("function") or {}
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        return None
    command = arguments
    if name == "bash":
        with contextlib.suppress(ValueError):
            parsed = json.loads(arguments)
            if isinstance(parsed, dict) and isinstance(parsed.get("command"), str):
                command = parsed["command"]
    return {"command": command, "tool_call_id": call.get("id"), "tool_name": name}


# Deeper JSON is refused on reading: real histories nest about ten levels, and the writer, the
# hashes and copies of a history recurse once per level (Python's limit is 1000 frames).
MAX_JSON_DEPTH = 200


def json_depth(value: Any) -> int:
    """How deeply `value` nests lists and objects (a scalar is 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (
                node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json_file(path: str | Path) -> Any:
    """Read and parse a JSON file; unreadable, broken or absurdly nested files raise
    `HistoryError`."""
    origin = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise refusal(origin, "no such file") from None
    except UnicodeDecodeError as exc:
        raise refusal(origin, f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise refusal(origin, f"cannot read the file: {exc.strerror or exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise refusal(origin, f"broken JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
                      ) from exc
    except RecursionError:
        value = None  # nested past Python's limit: refused as too deep below
    else:
        if json_depth(value) <= MAX_JSON_DEPTH:
            return value
    raise refusal(origin, f"JSON nested more than {MAX_JSON_DEPTH} levels deep; a history "
                  "or trajectory file nests about ten")


def load_history(path: str | Path) -> History:
    """Load and validate a history file. Every refusal is a `HistoryError` naming the file."""
    return History.from_json(parse_json_file(path), origin=str(path))


def save_history(history: History, path: str | Path) -> None:
    """Validate `history` and write it atomically to `path` (parents created, mode 0644)."""
    data = history.to_json()
    History.from_json(data, origin=str(path))
    write_json(path, data)


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (`common.files`); errors become `HistoryError` naming the file."""
    try:
        _write_json(path, data, indent=1)
    except (TypeError, ValueError, RecordWriteError) as exc:
        raise refusal(str(path), f"cannot write ({type(exc).__name__}: {exc}); "
                      "the previous file, if any, is unchanged") from exc


# --- validation -------------------------------------------------------------------------------

_ROLE_LIST = ", ".join(ROLES)


def validate_messages(messages: Any, *, origin: str, label: str = "message",
                      known_call_ids: set[str] | None = None) -> set[str]:
    """Check a message list; return the tool call ids seen (including `known_call_ids`).

    Refuses: non-objects, missing or unknown roles, content that is not a string (null is
    allowed only on an assistant turn with tool calls), reasoning or tool calls outside
    assistant turns, malformed tool calls, and a tool result whose `tool_call_id` matches no
    earlier tool call.
    """
    if not isinstance(messages, list):
        raise refusal(origin, f"must be a list of messages, got {type(messages).__name__}",
                      field_name="messages" if label == "message" else "extra.continuation")
    call_ids: set[str] = set(known_call_ids or ())
    for index, message in enumerate(messages):
        where = f"{label} {index}"
        if not isinstance(message, dict):
            raise refusal(origin, f"must be an object, got {type(message).__name__}", index=where)
        role = message.get("role")
        if role is None:
            raise refusal(origin, f"missing (expected one of {_ROLE_LIST})", index=where,
                          field_name="role")
        if role not in ROLES:
            raise refusal(origin, f"unknown role {role!r} (expected {_ROLE_LIST})", index=where,
                          field_name="role")
        calls = message.get("tool_calls")
        if "content" not in message:
            raise refusal(origin, "missing (use \"\" for an empty message)", index=where,
                          field_name="content")
        content = message["content"]
        if not isinstance(content, str) and not (content is None and role == "assistant"
                                                 and calls):
            raise refusal(origin, f"must be a string, got {type(content).__name__} (null only "
                          "on an assistant turn with tool calls)", index=where,
                          field_name="content")
        reasoning = message.get("reasoning")
        if reasoning is not None and (role != "assistant" or not isinstance(reasoning, str)):
            raise refusal(origin, "must be a string (or null) on an assistant message",
                          index=where, field_name="reasoning")
        if "extra" in message and not isinstance(message["extra"], dict):
            raise refusal(origin, "must be an object", index=where, field_name="extra")
        if calls is not None:
            if role != "assistant":
                raise refusal(origin, f"only assistant messages make tool calls, this is {role}",
                              index=where, field_name="tool_calls")
            call_ids.update(_validate_tool_calls(calls, origin=origin, where=where))
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise refusal(origin, "missing: a tool result must name the call it answers",
                              index=where, field_name="tool_call_id")
            if call_id not in call_ids:
                raise refusal(origin, f"{call_id!r} matches no earlier tool call (a tool result "
                              "must follow the assistant turn that requested it)", index=where,
                              field_name="tool_call_id")
    return call_ids


def _validate_tool_calls(calls: Any, *, origin: str, where: str) -> list[str]:
    if not isinstance(calls, list):
        raise refusal(origin, "must be a list", index=where, field_name="tool_calls")
    ids: list[str] = []
    for number, call in enumerate(calls):
        name = f"tool_calls[{number}]"
        if not isinstance(call, dict):
            raise refusal(origin, "must be an object", index=where, field_name=name)
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise refusal(origin, "missing or not a string", index=where, field_name=f"{name}.id")
        if call.get("type", "function") != "function":
            raise refusal(origin, f"unsupported type {call.get('type')!r} (expected 'function')",
                          index=where, field_name=f"{name}.type")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise refusal(origin, "must be an object with a string 'name'", index=where,
                          field_name=f"{name}.function")
        if not isinstance(function.get("arguments"), str):
            raise refusal(origin, "must be a JSON string", index=where,
                          field_name=f"{name}.function.arguments")
        ids.append(call["id"])
    return ids


def _require(mapping: dict[str, Any], key: str, kinds: type, *, origin: str,
             field_name: str, choices: tuple[str, ...] | None = None) -> Any:
    if key not in mapping:
        raise refusal(origin, "missing", field_name=field_name)
    value = mapping[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int):
        wanted = {int: "an integer", str: "a string", dict: "an object"}.get(kinds, str(kinds))
        raise refusal(origin, f"must be {wanted}, got {type(value).__name__}",
                      field_name=field_name)
    if choices is not None and value not in choices:
        raise refusal(origin, f"unknown value {value!r} (expected {', '.join(choices)})",
                      field_name=field_name)
    return value


def _validate_fork(raw: Any, messages: list[dict[str, Any]], protocol: str, *,
                   origin: str) -> Fork | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise refusal(origin, "must be an object or null", field_name="extra.fork")
    index = _require(raw, "message_index", int, origin=origin,
                     field_name="extra.fork.message_index")
    if not 0 <= index < len(messages):
        raise refusal(origin, f"fork at message {index} is out of range (the history has "
                      f"{len(messages)} messages)", field_name="extra.fork.message_index")
    message = messages[index]
    if message.get("role") != "assistant":
        raise refusal(origin, f"the fork must be an assistant turn, this is a "
                      f"{message.get('role')} message", index=index,
                      field_name="extra.fork.message_index")
    found = message_action(message, protocol)
    if found is None:
        wanted = "exactly one tool call" if protocol == "tool_calls" else (
            "exactly one fenced ```bash action block")
        raise refusal(origin, f"the fork's assistant turn has no action (expected {wanted})",
                      index=index, field_name="extra.fork.message_index")
    if index != len(messages) - 1:
        raise refusal(origin, f"messages continue after the fork ({len(messages)} messages); a "
                      "history ends at its fork (keep later ones in extra.continuation)",
                      index=index, field_name="extra.fork.message_index")
    action = _require(raw, "action", dict, origin=origin, field_name="extra.fork.action")
    _require(action, "command", str, origin=origin, field_name="extra.fork.action.command")
    if "tool_call_id" in action and action["tool_call_id"] != found.get("tool_call_id"):
        raise refusal(origin, f"{action['tool_call_id']!r} is not the id of the fork's tool call "
                      f"({found.get('tool_call_id')!r})", index=index,
                      field_name="extra.fork.action.tool_call_id")
    pending = raw.get("pending_result")
    if pending is not None and not isinstance(pending, str):
        raise refusal(origin, "must be a string or null", field_name="extra.fork.pending_result")
    return Fork(message_index=index, action=action, pending_result=pending)


def _validate_history_json(data: Any, *, origin: str) -> History:
    if not isinstance(data, dict):
        raise refusal(origin, f"a history file is a JSON object, got {type(data).__name__}")
    if data.get("history_format") != HISTORY_FORMAT:
        hint = (" (it looks like a trajectory or message list: import it with "
                "`compaction-bench histories import FILE OUT.json`)")
        raise refusal(origin, f"must be {HISTORY_FORMAT!r}, got {data.get('history_format')!r}"
                      + hint, field_name="history_format")
    version = data.get("history_version")
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise refusal(origin, f"version {version!r} is not supported (supported: {supported})",
                      field_name="history_version")
    if "messages" not in data:
        raise refusal(origin, "missing", field_name="messages")
    messages = data["messages"]
    call_ids = validate_messages(messages, origin=origin)
    info = data.get("info", {})
    if not isinstance(info, dict):
        raise refusal(origin, "must be an object", field_name="info")
    extra = _require(data, "extra", dict, origin=origin, field_name="extra")
    task = _require(extra, "task", str, origin=origin, field_name="extra.task")
    arm = _require(extra, "arm", str, origin=origin, field_name="extra.arm")
    if not task or not arm:
        raise refusal(origin, "task and arm must be non-empty", field_name="extra.task")
    mode = _require(extra, "reasoning_mode", str, origin=origin,
                    field_name="extra.reasoning_mode", choices=REASONING_MODES)
    protocol = _require(extra, "action_protocol", str, origin=origin,
                        field_name="extra.action_protocol", choices=ACTION_PROTOCOLS)
    fork = _validate_fork(extra.get("fork"), messages, protocol, origin=origin)
    provenance = extra.get("provenance") or {}
    source = extra.get("source")
    tools = extra.get("tools")
    continuation = extra.get("continuation") or []
    if not isinstance(provenance, dict):
        raise refusal(origin, "must be an object", field_name="extra.provenance")
    if source is not None and not isinstance(source, dict):
        raise refusal(origin, "must be an object or null", field_name="extra.source")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise refusal(origin, "must be a list of tool schemas or null", field_name="extra.tools")
    validate_messages(continuation, origin=origin, label="continuation message",
                      known_call_ids=call_ids)
    return History(messages=messages, task=task, arm=arm, reasoning_mode=mode,
                   action_protocol=protocol, fork=fork, info=info, provenance=provenance,
                   source=source, tools=tools, continuation=continuation)
