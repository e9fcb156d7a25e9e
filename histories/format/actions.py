"""The action syntax of text-protocol turns, in one place: fenced action blocks, mini-swe-agent's
THOUGHT label, decision tasks' JSON calls and FINAL lines, and what structured outputs force.

A text-protocol assistant turn is a thought and exactly one fenced action block; the fence
languages below mark an action (mini-swe-agent v1 `bash`, v2 `mswea_bash_command`, SWE-agent's
untagged fence, and `json` for a decision task's tool call written as text).
"""

from __future__ import annotations

import re
from typing import Any

ACTION_FENCE_LANGS = frozenset({"bash", "sh", "shell", "mswea_bash_command", "json", ""})
FENCE_RE = re.compile(r"```([\w-]*)[ \t]*\n(.*?)\n?```", re.DOTALL)
THOUGHT_LABEL_RE = re.compile(r"^THOUGHT:[ \t]*")
# Where an importer keeps the action an agent recorded for a text turn (SWE-agent's `action`).
RECORDED_ACTION_KEY = "recorded_action"
# What mini-swe-agent parses a bash action with (its text protocol).
BASH_ACTION_REGEX = r"```bash\s*\n(.*?)\n```"
# What structured outputs force in the text protocol: one THOUGHT line, then one fenced command.
# Unbounded repeats on purpose (max_tokens bounds the length): xgrammar needs about 4 s to
# compile `{1,400}` on these 2 cores, past vLLM's 5 s limit under load, and 0.02 s for `+`.
STRUCTURED_TEXT_REGEX = r"THOUGHT: [^\n`]+\n\n```bash\n[^`\n][^`]*\n```"
# A decision task's answer line (optionally bold), and its tool call written as text.
FINAL_LINE_RE = re.compile(r"(?im)^\s*(?:\*\*)?FINAL:")
JSON_FENCE_RE = re.compile(r"```json[ \t]*\n(.*?)\n?```", re.DOTALL)
# A candidate or case id inside structured-outputs regexes.
ID_PATTERN = r"[A-Za-z0-9_.-]{1,24}"


def action_fences(content: str) -> list[re.Match[str]]:
    """The fenced blocks of `content` whose language marks an action."""
    return [m for m in FENCE_RE.finditer(content) if m.group(1) in ACTION_FENCE_LANGS]


def action_fence(content: str, recorded: str | None = None) -> re.Match[str] | None:
    """The fenced block that holds a text turn's action: where the agent recorded the action it
    parsed (`recorded`, SWE-agent's `action`), the last action fence whose body is that action
    (SWE-agent's parser takes the last block; earlier ones are part of the thought); otherwise
    the only action fence. None when there is no such block, or several and nothing recorded."""
    if recorded is not None and recorded.strip():
        # searched as text, not as paired fences: a thought may hold unpaired backticks (an
        # edited one, or a model's own), and the action block must still be found
        block = re.compile(r"```([\w-]*)[ \t]*\n(" + re.escape(recorded.strip()) + r")\n?```")
        found = [m for m in block.finditer(content) if m.group(1) in ACTION_FENCE_LANGS]
        if found:
            return found[-1]
    actions = action_fences(content)
    return actions[0] if len(actions) == 1 else None


def split_text_action(content: str, recorded: str | None = None) -> tuple[str, str] | None:
    """(thought, command) of a text turn (its action block as `action_fence` finds it), else
    None."""
    match = action_fence(content, recorded)
    if match is None:
        return None
    thought = (content[: match.start()] + content[match.end():]).strip()
    return thought, match.group(2).strip()


def recorded_action(message: dict[str, Any]) -> str | None:
    """The action the agent itself parsed from a text turn, where its log recorded one (an
    importer keeps it as `extra.recorded_action`)."""
    extra = message.get("extra")
    value = extra.get(RECORDED_ACTION_KEY) if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


def message_text_action(message: dict[str, Any]) -> tuple[str, str] | None:
    """(thought, command) of a text-protocol message, using its recorded action where present."""
    return split_text_action(str(message.get("content") or ""), recorded_action(message))


def has_final_line(text: str | None) -> bool:
    """Whether `text` has a `FINAL:` line (the answer check itself is the task's)."""
    return bool(text) and FINAL_LINE_RE.search(text or "") is not None
