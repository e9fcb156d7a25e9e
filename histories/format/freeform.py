"""Freeform tool calls: calls whose input is raw text, not JSON arguments (OpenAI's `custom`
tools; Codex logs its `apply_patch` as `custom_tool_call` items).

A history holds one as a function call whose arguments are `{"input": <the recorded text>}`,
and lists its id in its assistant turn's `extra.freeform_tool_calls`: the recorded shape
(OpenAI chat's `{"id", "type": "custom", "custom": {"name", "input"}}`) stays known and can be
rebuilt from the history byte for byte.

Why a replay does not send the recorded shape: it replays to vLLM's chat completions, which
refuse an assistant tool call of any type but 'function' ("chat completions only support
assistant tool_calls of type 'function'", vllm/renderers/chat_utils.py `_postprocess_messages`)
and show a custom tool to the model as a function whose one string parameter is `input`
(vllm/tool_parsers/utils.py `custom_tool_as_function_dict`). The function call held here is that
shape. What differs from the recording: the chat template renders the text as a JSON string
(newlines and quotes escaped), so those prompt tokens are not the recorded raw text's. A replay
plan counts such calls (`loadgen.replay.ReplayPlan.freeform_tool_calls`) and the report says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

FREEFORM_KEY = "freeform_tool_calls"  # an assistant turn's extra: the ids of its freeform calls
INPUT_KEY = "input"  # the one argument a freeform call's text is held under (vLLM's name too)
HELD_AS = ('function calls whose arguments are {"input": <the recorded text>}, listed in their '
           "turn's extra.freeform_tool_calls: a replay sends that shape, not the recorded "
           "custom call, since vLLM's chat completions take function tool calls only")


def freeform_ids(message: dict[str, Any]) -> list[str]:
    """The ids of the freeform calls of an assistant turn."""
    extra = message.get("extra")
    ids = extra.get(FREEFORM_KEY) if isinstance(extra, dict) else None
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def count_freeform(messages: Iterable[dict[str, Any]]) -> int:
    """How many freeform calls `messages` hold."""
    return sum(len(freeform_ids(m)) for m in messages)
