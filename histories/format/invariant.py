"""The reasoning-only invariant (Section 2): an arm's first postfork request differs from
clean's only in assistant reasoning.

Pure: two request bodies in, a report out. The bodies compared are the exact JSON the
continuation sends (`histories.agent.continuation.first_request` builds them with the run's
real settings, the arm's policy and salt; the bench also checks that the body actually sent
hashes the same). Compared field by field; a failure names the first differing field outside
reasoning, e.g. `messages[3].tool_calls[0].function.arguments`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.format.actions import action_fences, split_text_action
from compaction_bench.histories.format.reasoning import without_thought

_REASONING_PATH = re.compile(r"^messages\[(\d+)\]\.(reasoning|reasoning_content)$")
_CONTENT_PATH = re.compile(r"^messages\[(\d+)\]\.content$")
_MISSING = object()


class InvariantError(SuiteError):
    """An arm differs from clean outside assistant reasoning; the text names the field."""


@dataclass(frozen=True)
class InvariantReport:
    arm: str
    passed: bool
    reasoning_fields: list[str]  # the fields that differ (all assistant reasoning)
    clean_sha256: str | None = None  # sha256 of each compared body's exact bytes
    arm_sha256: str | None = None
    other_fields: list[str] = field(default_factory=list)  # differing non-reasoning fields

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every (path, value in a, value in b) where two JSON values differ, depth first."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                yield where, a.get(key, _MISSING), b.get(key, _MISSING)
            else:
                yield from differences(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path} (length)", len(a), len(b)
            return
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}[{index}]")
    elif type(a) is not type(b) or a != b:
        yield path, a, b


def is_reasoning(path: str, clean: dict[str, Any], arm: dict[str, Any], reasoning_mode: str,
                 protocol: str) -> bool:
    """Whether a differing field is assistant reasoning (and nothing else rides along).

    `reasoning_mode` "wire" is a replay's body (loadgen.replay): native reasoning fields, or
    content that differs only in its inlined thought (`reasoning.inline_thought`)."""
    messages_c, messages_a = clean.get("messages") or [], arm.get("messages") or []
    match = _REASONING_PATH.match(path) or _CONTENT_PATH.match(path)
    if match is None:
        return False
    index = int(match.group(1))
    if index >= len(messages_c) or index >= len(messages_a):
        return False
    if messages_c[index].get("role") != "assistant" or messages_a[index].get("role") != (
            "assistant"):
        return False
    if _REASONING_PATH.match(path):
        return reasoning_mode in ("native", "wire")
    if reasoning_mode == "wire":
        content_c, content_a = messages_c[index].get("content"), messages_a[index].get("content")
        return bool(without_thought(content_c) == without_thought(content_a))
    if reasoning_mode == "native":
        return False  # visible content is not reasoning in native mode
    if protocol == "tool_calls":
        # the content of a turn with a tool call is its thought (tool calls are compared on their
        # own); a turn without one is dialogue, never reasoning (reasoning.block_text)
        return bool(messages_c[index].get("tool_calls"))
    content_c = str(messages_c[index].get("content") or "")
    content_a = str(messages_a[index].get("content") or "")
    split_c, split_a = split_text_action(content_c), split_text_action(content_a)
    if split_c is not None and split_a is not None:
        return split_c[1] == split_a[1]
    # Several fences: SWE-agent ran the last one and counts everything else as the thought
    # (even text after it); `reasoning.replace_block` puts the block last, after the record.
    fences = action_fences(content_c)
    return bool(fences) and content_a.rstrip().endswith(fences[-1].group(0))


def compare_bodies(clean: dict[str, Any], arm: dict[str, Any], *, arm_name: str, task: str,
                   reasoning_mode: str, protocol: str, clean_sha256: str | None = None,
                   arm_sha256: str | None = None, of: str = "task") -> InvariantReport:
    """The one check of the invariant, for live agents and replay alike (`reasoning_mode`
    "wire"): raise `InvariantError` naming the first field outside assistant reasoning where
    two first postfork requests differ; else report the reasoning fields that differ. `of`
    names what `task` is in the message ("replay source" for a replay record)."""
    allowed = []
    for path, was, now in differences(clean, arm):
        if not is_reasoning(path, clean, arm, reasoning_mode, protocol):
            show = "(absent)" if was is _MISSING else repr(was)[:120]
            got = "(absent)" if now is _MISSING else repr(now)[:120]
            raise InvariantError(
                f"arm {arm_name} of {of} {task} differs from clean outside assistant "
                f"reasoning in the first postfork request, first at field '{path}': clean "
                f"{show}, {arm_name} {got}")
        allowed.append(path)
    return InvariantReport(arm=arm_name, passed=True, reasoning_fields=allowed,
                           clean_sha256=clean_sha256, arm_sha256=arm_sha256)
