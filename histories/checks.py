"""Checks before an arm is used: the reasoning-only invariant, lexical diagnostics per block, an
optional fidelity judge (Appendix A.4) and the gate that decides what blocks an arm.

- Invariant (Section 2): the first postfork request of an arm, serialized as the continuation
  would send it, differs from clean's only in assistant reasoning. Compared field by field; a
  failure names the first differing field, e.g. `messages[3].tool_calls[0].function.arguments`.
- Lexical diagnostics: `histories.lexical` (numbers and identifiers of the raw block missing
  from its record), recorded for every rewritten block.
- Judge: the study's semantic-review prompt and JSON verdict schema against any endpoint. Its
  payload is the raw reasoning, the candidate state and the requested tool call, never a result.
  A malformed or failed review does not pass.
- Gate: `off` records everything and blocks nothing; `judge` blocks an arm with a block the judge
  failed; `strict` also blocks one whose record lacks a required identifier or threshold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict

from histories.chat import ChatModel, ChatModelConfig
from histories.continuation import pending_observation
from histories.endpoint import EndpointConfig, EndpointError, client_for, complete
from histories.format import History, message_action, split_text_action
from histories.lexical import LexicalDiagnostics, lexical_diagnostics
from histories.prompts import load_prompt
from histories.redaction import redact
from histories.timing import Clock, monotonic

Gate = Literal["off", "judge", "strict"]
GATES: tuple[Gate, ...] = ("off", "judge", "strict")
VERDICT_KEYS = ("verdict", "critical_or_material_issue", "future_result_leakage",
                "requested_action_preserved", "explanation")
_REASONING_PATH = re.compile(r"^messages\[(\d+)\]\.(reasoning|reasoning_content)$")
_CONTENT_PATH = re.compile(r"^messages\[(\d+)\]\.content$")
_MISSING = object()

__all__ = ["GATES", "Gate", "InvariantError", "InvariantReport", "JudgeConfig",
           "LexicalDiagnostics", "Verdict", "check_reasoning_only", "first_request",
           "gate_failures", "judge_block", "lexical_diagnostics"]


class InvariantError(ValueError):
    """An arm differs from clean outside assistant reasoning; the text names the field."""


@dataclass(frozen=True)
class InvariantReport:
    arm: str
    passed: bool
    reasoning_fields: list[str]  # the fields that differ (all assistant reasoning)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def first_request(history: History, config: ChatModelConfig | None = None) -> dict[str, Any]:
    """The chat-completions body of the first postfork request, as the continuation sends it
    (wire messages through the pending observation, sampling, tools)."""
    if history.fork is None or history.fork.pending_result is None:
        raise InvariantError(f"arm {history.arm} of task {history.task}: no fork with a pending "
                             "result, so there is no first postfork request to compare")
    cfg = config or ChatModelConfig(
        base_url="http://invariant-check.invalid/v1",
        protocol=cast(Literal["tool_calls", "text"], history.action_protocol),
        reasoning_mode=cast(Literal["native", "tagged-visible"], history.reasoning_mode),
        structured_text=bool(history.provenance.get("structured_text", False)))
    model = ChatModel(cfg)  # builds the body only; nothing is sent
    prefix = history.messages[: history.fork.message_index + 1]
    body = model.request_body(model.api_messages([*prefix, pending_observation(history)]))
    if history.tools is not None:
        body["tools"] = history.tools
    return body


def _differences(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                yield where, a.get(key, _MISSING), b.get(key, _MISSING)
            else:
                yield from _differences(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path} (length)", len(a), len(b)
            return
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{path}[{index}]")
    elif type(a) is not type(b) or a != b:
        yield path, a, b


def _reasoning_only(path: str, clean: dict[str, Any], arm: dict[str, Any],
                    history: History) -> bool:
    """Whether a differing field is assistant reasoning (and nothing else rides along)."""
    messages_c, messages_a = clean["messages"], arm["messages"]
    match = _REASONING_PATH.match(path) or _CONTENT_PATH.match(path)
    if match is None:
        return False
    index = int(match.group(1))
    if messages_c[index].get("role") != "assistant" or messages_a[index].get("role") != (
            "assistant"):
        return False
    if _REASONING_PATH.match(path):
        return history.reasoning_mode == "native"
    if history.reasoning_mode == "native":
        return False  # visible content is not reasoning in native mode
    if history.action_protocol == "tool_calls":
        return True  # the content is the thought; tool calls are compared on their own
    split_c = split_text_action(messages_c[index].get("content") or "")
    split_a = split_text_action(messages_a[index].get("content") or "")
    return split_c is not None and split_a is not None and split_c[1] == split_a[1]


def check_reasoning_only(clean: History, arm: History,
                         config: ChatModelConfig | None = None) -> InvariantReport:
    """Raise `InvariantError` naming the first field outside assistant reasoning where the
    first postfork requests of `clean` and `arm` differ; else report the reasoning fields."""
    if clean.fork is not None and arm.fork is not None and clean.fork.action != arm.fork.action:
        raise InvariantError(f"arm {arm.arm} of task {arm.task}: field extra.fork.action differs "
                             "from clean's (the fork's pending action must be shared)")
    body_c, body_a = first_request(clean, config), first_request(arm, config)
    allowed = []
    for path, was, now in _differences(body_c, body_a, ""):
        if not _reasoning_only(path, body_c, body_a, clean):
            show = "(absent)" if was is _MISSING else repr(was)[:120]
            got = "(absent)" if now is _MISSING else repr(now)[:120]
            raise InvariantError(
                f"arm {arm.arm} of task {arm.task} differs from clean outside assistant "
                f"reasoning in the first postfork request, first at field '{path}': clean "
                f"{show}, {arm.arm} {got}")
        allowed.append(path)
    return InvariantReport(arm=arm.arm, passed=True, reasoning_fields=allowed)


# --- fidelity judge (Appendix A.4) ------------------------------------------------------------

class JudgeConfig(BaseModel):
    """Where the fidelity judge runs. External judges get the same redaction as compressors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: EndpointConfig
    prompt: str = "judge-a4"
    max_tokens: int = 512
    redact: bool = True


@dataclass(frozen=True)
class Verdict:
    """One block's review. `passed` is the study's acceptance: verdict 'pass', no material
    issue, no future-result leakage, requested action preserved. Malformed: not passed."""

    passed: bool
    verdict: str | None
    critical_or_material_issue: bool | None
    future_result_leakage: bool | None
    requested_action_preserved: bool | None
    explanation: str | None
    error: str | None
    response: str
    latency_s: float
    prompt_sha256: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tool_call_text(message: dict[str, Any], protocol: str) -> str:
    """The requested tool call as the judge sees it: `name(arguments)`."""
    if protocol == "text":
        action = message_action(message, protocol)
        return f"bash({json.dumps({'command': action['command']})})" if action else "none"
    calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
    return "; ".join(f"{f.get('name')}({f.get('arguments')})" for f in calls) or "none"


def judge_payload(raw: str, record: str, tool_call: str) -> str:
    return (f"Requested tool call: {tool_call}\n\nRaw reasoning:\n{raw}\n\n"
            f"Candidate state:\n{record}")


def parse_verdict(text: str) -> dict[str, Any]:
    """The one JSON object of a review, with exactly the schema's keys and types."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the review")
    data = json.loads(text[start: end + 1])
    if not isinstance(data, dict) or set(data) != set(VERDICT_KEYS):
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"review keys {keys} are not exactly {list(VERDICT_KEYS)}")
    if data["verdict"] not in ("pass", "fail") or not isinstance(data["explanation"], str) or (
            not all(isinstance(data[k], bool) for k in VERDICT_KEYS[1:4])):
        raise ValueError("review values do not match the schema")
    return data


def judge_block(raw: str, record: str, tool_call: str, config: JudgeConfig, *,
                clock: Clock = monotonic) -> Verdict:
    """Review one rewrite with the A.4 rubric; endpoint trouble or a malformed answer gives a
    verdict that does not pass (with the error)."""
    prompt = load_prompt(config.prompt)
    text = judge_payload(raw, record, tool_call)
    if config.redact:
        text = redact(text).text
    messages = [{"role": "system", "content": prompt.text}, {"role": "user", "content": text}]
    response, latency = "", 0.0
    try:
        got = complete(client_for(config.endpoint), config.endpoint, messages,
                       max_tokens=config.max_tokens, clock=clock)
        response, latency = got.text, got.latency_s
        data = parse_verdict(got.text)
    except (EndpointError, ValueError) as exc:
        return Verdict(passed=False, verdict=None, critical_or_material_issue=None,
                       future_result_leakage=None, requested_action_preserved=None,
                       explanation=None, error=f"{type(exc).__name__}: {exc}", response=response,
                       latency_s=latency, prompt_sha256=prompt.sha256)
    passed = (data["verdict"] == "pass" and not data["critical_or_material_issue"]
              and not data["future_result_leakage"] and data["requested_action_preserved"])
    return Verdict(passed=passed, error=None, response=response, latency_s=latency,
                   prompt_sha256=prompt.sha256, **data)


def gate_failures(blocks: list[dict[str, Any]], gate: Gate) -> list[str]:
    """Why an arm is blocked under `gate`, one line per failing block (empty: not blocked).
    `blocks` are an arm's provenance block entries (`arms.py`)."""
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; use one of {', '.join(GATES)}")
    reasons = []
    for block in blocks:
        where = f"message {block.get('message_index')}"
        verdict = block.get("judge")
        if gate in ("judge", "strict") and verdict is not None and not verdict["passed"]:
            reasons.append(f"{where}: fidelity judge did not pass "
                           f"({verdict.get('error') or verdict.get('explanation')})")
        if gate == "strict" and block.get("missing_required"):
            reasons.append(f"{where}: record lacks required "
                           f"{', '.join(block['missing_required'])}")
    return reasons
