"""Decision-task actions in the agent loop: what the model is told and forced to write, and how
its reply becomes an action for `histories.tasks.decision.DecisionEnvironment`.

- `tool_calls` protocol: the task's own tool schemas go to the server (instead of the `bash`
  tool); every tool call becomes one action `{"tool_name", "arguments", "tool_call_id",
  "command": <arguments JSON>}`. A call naming no task tool is still an action: the environment
  answers it with its deterministic `unknown_tool` error, which keeps each tool call paired with
  its tool message (chat templates need the pair).
- `text` protocol (models without tool calling): one THOUGHT line, then either one JSON object
  `{"name": ..., "arguments": {...}}` in a ```json fence or a `FINAL: <id>` line. vLLM's
  structured outputs force that shape with `structured_regex(tools)`, whose alternation covers
  each tool's name with arguments of the schema's shape.
- In both, a reply with no action but a `FINAL:` line ends the run: the action
  `{"final_answer": <reply text>}` makes the environment raise mini-swe-agent's `Submitted`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jinja2 import StrictUndefined, Template
from minisweagent.exceptions import FormatError

from compaction_bench.histories.format.actions import ID_PATTERN as _ID
from compaction_bench.histories.format.actions import JSON_FENCE_RE, has_final_line

FORMAT_ERROR_TEMPLATE = (
    "Format error: {{error}}. Reply with one THOUGHT line and then either exactly one tool call "
    "or, after the final evidence result, a line FINAL: <candidate_id>."
)
OBSERVATION_TEMPLATE = "{{output.output}}"  # the tool result text exactly as the study sent it

TEXT_PROTOCOL_NOTE = """
Tool calls are written as text. Reply with one THOUGHT line, then one tool call as a JSON object \
in a ```json block, like this:

THOUGHT: {example_thought}

```json
{example_call}
```

The tool result comes in the next message. After the final evidence result, reply with one \
THOUGHT line and then the line FINAL: <candidate_id> instead of a tool call.

Tools:
{tool_lines}"""


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [str(t["function"]["name"]) for t in tools]


def _arguments_regex(parameters: dict[str, Any]) -> str:
    """JSON arguments in the schema's key order: strings are ids, arrays hold ids with the
    schema's item counts (compact-ish JSON, one space after separators)."""
    parts = []
    for key, prop in parameters.get("properties", {}).items():
        if prop.get("type") == "array":
            low, high = int(prop.get("minItems", 1)), prop.get("maxItems")
            more = f"{{{max(low - 1, 0)},{int(high) - 1 if high else 7}}}"
            value = rf'\["{_ID}"(, "{_ID}"){more}\]'
        else:
            value = f'"{_ID}"'
        parts.append(f'"{re.escape(key)}": {value}')
    return r"\{" + ", ".join(parts) + r"\}"


def structured_regex(tools: list[dict[str, Any]], *, final: bool = True) -> str:
    """The structured-outputs regex for the text protocol: a THOUGHT line, then one JSON call
    of a listed tool (alternation over the tools, each with its own argument shape) in a
    ```json fence, or (with `final`) a FINAL line."""
    calls = "|".join(
        rf'\{{"name": "{re.escape(t["function"]["name"])}", "arguments": '
        rf'{_arguments_regex(t["function"].get("parameters", {}))}\}}' for t in tools)
    answer = rf"|FINAL: {_ID}" if final else ""
    # `+`, not `{1,n}`: bounded repeats make xgrammar's compile slow (see format/actions.py)
    return rf"THOUGHT: [^\n`]+\n\n(```json\n({calls})\n```{answer})"


def text_protocol_system(system: str, tools: list[dict[str, Any]], case_id: str) -> str:
    """The task's system prompt plus how to write tool calls as text (the tools are not sent to
    the server in this protocol, so the prompt lists them)."""
    lines = []
    for tool in tools:
        fn = tool["function"]
        params = ", ".join(
            f"{key}: {'list of ids' if prop.get('type') == 'array' else 'string'}"
            for key, prop in fn.get("parameters", {}).get("properties", {}).items())
        lines.append(f"- {fn['name']}({params}): {fn.get('description', '')}")
    # the example is phase 1's call: the system prompt names the phase order anyway, and a
    # concrete call is what a small model copies the shape from
    example = json.dumps({"name": tools[0]["function"]["name"], "arguments": {"case_id": case_id}})
    return system + TEXT_PROTOCOL_NOTE.format(
        example_thought="I start with phase 1.", example_call=example,
        tool_lines="\n".join(lines))


def _format_error(error: str, template: str, finish: str | None) -> FormatError:
    content = Template(template, undefined=StrictUndefined).render(
        error=error, actions=[], finish_reason=finish)
    return FormatError({"role": "user", "content": content,
                        "extra": {"interrupt_type": "FormatError"}})


def parse_decision_actions(message: dict[str, Any], protocol: str, *, format_error_template: str,
                           finish_reason: str | None) -> list[dict[str, Any]]:
    """The actions a decision-task reply requests (see the module docstring); a reply with
    neither an action nor a FINAL line raises mini-swe-agent's `FormatError`."""
    content = message.get("content") or ""
    actions: list[dict[str, Any]] = []
    if protocol == "tool_calls":
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments") or "{}"
            actions.append({"tool_name": function.get("name") or "", "arguments": arguments,
                            "tool_call_id": call.get("id"), "command": arguments})
    else:
        fences = JSON_FENCE_RE.findall(content)
        if len(fences) > 1:
            raise _format_error(f"found {len(fences)} ```json blocks; send exactly one tool call",
                                format_error_template, finish_reason)
        if fences:
            body = fences[0].strip()
            try:
                call = json.loads(body)
            except json.JSONDecodeError as exc:
                raise _format_error(f"the ```json block is not valid JSON ({exc.msg})",
                                    format_error_template, finish_reason) from None
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise _format_error('the ```json block must be {"name": ..., "arguments": '
                                    "{...}}", format_error_template, finish_reason)
            actions.append({"tool_name": call["name"],
                            "arguments": json.dumps(call.get("arguments", {})),
                            "command": body})
    if actions:
        return actions
    if has_final_line(content):
        return [{"final_answer": content}]
    raise _format_error("no tool call and no FINAL line found", format_error_template,
                        finish_reason)
