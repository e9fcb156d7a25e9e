"""The fidelity judge (Appendix A.4) and the gate that decides which blocks an arm.

- Judge: the study's semantic-review prompt and JSON verdict schema against any endpoint. Its
  payload is the raw reasoning, the candidate state and the requested tool call, never a result.
  A malformed or failed review does not pass.
- Gate: `off` records everything and blocks nothing; `judge` blocks an arm with a block the judge
  failed (and refuses to start without a judge configured: every rewrite would pass unseen);
  `strict` also blocks one whose record lacks a required identifier or threshold.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.endpoint import CompletionError, EndpointConfig, complete
from compaction_bench.histories.compaction.prompts import load_prompt
from compaction_bench.histories.compaction.redaction import redact
from compaction_bench.histories.format.history import message_action

Gate = Literal["off", "judge", "strict"]
GATES: tuple[Gate, ...] = ("off", "judge", "strict")
VERDICT_KEYS = ("verdict", "critical_or_material_issue", "future_result_leakage",
                "requested_action_preserved", "explanation")


class GateError(SuiteError):
    """A gate that cannot work as configured (unknown, or a judge gate without a judge)."""


def check_gate(gate: str, judge: JudgeConfig | None) -> Gate:
    """The gate, refused where it is unknown or names a judge that is not configured."""
    if gate not in GATES:
        raise GateError(f"unknown gate {gate!r}; use one of {', '.join(GATES)}")
    if gate in ("judge", "strict") and judge is None:
        raise GateError(f"gate={gate} needs a fidelity judge (--judge-url); without one every "
                        "rewrite would pass unreviewed")
    return gate


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
        got = complete(config.endpoint, messages, max_tokens=config.max_tokens, clock=clock)
        response, latency = got.text, got.latency_s
        data = parse_verdict(got.text)
    except (CompletionError, ValueError) as exc:
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
        raise GateError(f"unknown gate {gate!r}; use one of {', '.join(GATES)}")
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
