"""Reasoning blocks inside assistant messages: find one, name its action, put a record in its
place without touching anything else.

Where the block is: `block_text`, the one definition (`History.reasoning_blocks` uses it).
mini-swe-agent's `THOUGHT:` label is protocol, not reasoning: it is kept out of the compressor and
put back in front of the record.
"""

from __future__ import annotations

from typing import Any

from compaction_bench.histories.format.actions import (
    THOUGHT_LABEL_RE,
    action_fence,
    message_text_action,
    recorded_action,
)

# --- reasoning inlined into content, for a target without a reasoning field -------------------

THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n"


def inline_thought(reasoning: str, content: str | None) -> str:
    """Native reasoning inlined in front of the content, as a replay sends it to a target without
    a reasoning field (`loadgen.schedule.wire_messages`, REPLAY reasoning=inline)."""
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content or ''}"


def without_thought(content: Any) -> Any:
    """Content with its inlined thought (`inline_thought`) taken off; anything else as it is."""
    if isinstance(content, str) and content.startswith(THINK_OPEN):
        end = content.find(THINK_CLOSE)
        if end >= 0:  # the newline an inlined tool call adds after a thought goes with it
            return content[end + len(THINK_CLOSE):].lstrip("\n")
    return content


# --- blocks inside messages --------------------------------------------------------------------

def action_name(message: dict[str, Any], protocol: str) -> str:
    """The requested action's name: the tool function's name for tool calls (all of them,
    joined, where a turn makes several), `bash` for a text-protocol fenced command, `none`."""
    if protocol == "text":
        return "bash" if message_text_action(message) else "none"
    names = [str((call.get("function") or {}).get("name", ""))
             for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    return ",".join(names) if names else "none"


def block_text(message: dict[str, Any], reasoning_mode: str, protocol: str) -> str:
    """An assistant message's reasoning block (`History.reasoning_blocks` returns these).

    native: the `reasoning` field. tagged-visible: the visible thought, i.e. the content without
    its action block (text; the block the agent recorded as its action where it did) or the
    whole content of a turn that makes a tool call. A tool-call-protocol turn without a tool
    call (a chat agent's reply to its user, a final answer) has no reasoning block: its text is
    the dialogue itself, so every policy leaves it as it is.
    """
    if reasoning_mode == "native":
        return str(message.get("reasoning") or "")
    content = str(message.get("content") or "")
    if protocol == "text":
        split = message_text_action(message)
        return split[0] if split else content.strip()
    return content.strip() if message.get("tool_calls") else ""


def thought_label(block: str) -> tuple[str, str]:
    """('THOUGHT: ', rest) for a text-protocol thought with mini-swe-agent's label, else
    ('', block): the label is protocol, not reasoning, and is kept out of the compressor."""
    match = THOUGHT_LABEL_RE.match(block)
    return (match.group(0), block[match.end():]) if match else ("", block)


def replace_block(message: dict[str, Any], record: str, reasoning_mode: str,
                  protocol: str) -> dict[str, Any]:
    """A copy of `message` carrying `record` as its reasoning block; the message itself when the
    record equals the block (identity keeps every byte). The action is never touched."""
    if record == block_text(message, reasoning_mode, protocol):
        return message
    new = dict(message)
    if reasoning_mode == "native":
        new["reasoning"] = record
        if "reasoning_content" in new:  # a provider alias must not keep the original beside it
            new["reasoning_content"] = record
        return new
    content = str(message.get("content") or "")
    if protocol == "text":
        fence = action_fence(content, recorded_action(message))
        if fence is None:
            raise ValueError("text-protocol message without exactly one action block")
        new["content"] = f"{record}\n\n{fence.group(0)}"
        return new
    if not message.get("tool_calls"):
        raise ValueError("a tool-call-protocol turn without a tool call has no reasoning block "
                         "(its text is dialogue)")
    new["content"] = record
    return new
