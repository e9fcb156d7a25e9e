"""A mini-swe-agent `Model` that talks to any OpenAI-compatible server with the `openai` client.

It streams every response and stamps each chunk on arrival (one monotonic clock), records usage
(prompt, cached, completion, reasoning tokens) per request, and supports two action protocols:

- `tool_calls`: a native `bash` tool; the model's reasoning field is sent back on later turns.
- `text`: one fenced bash block per turn (mini-swe-agent's text protocol). With
  `structured_text`, vLLM's structured outputs force a THOUGHT line and one fenced command, which
  is what lets a 135M model produce well-formed actions; the manifest records when it is used.

With `tools` set (decision tasks), the task's tools replace `bash` and replies are parsed by
`histories.decision_actions` (tool calls of the task's tools, JSON text actions, FINAL lines).

Using the `openai` client instead of litellm avoids litellm's network fetch of a price map at
start-up (it waits on retries without network) and gives direct access to vLLM's usage fields.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from minisweagent.exceptions import FormatError
from minisweagent.models.utils.actions_text import (
    format_observation_messages,
    parse_regex_actions,
)
from minisweagent.models.utils.actions_toolcall import (
    BASH_TOOL,
    format_toolcall_observation_messages,
    parse_toolcall_actions,
)
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageToolCall
from pydantic import BaseModel, ConfigDict

from histories.decision_actions import parse_decision_actions
from histories.policy import HistoryPolicy
from histories.timing import Clock, monotonic
from serve.profile import Profile

ACTION_REGEX = r"```bash\s*\n(.*?)\n```"
# What structured outputs force in the text protocol: one THOUGHT line, then one fenced command.
# Unbounded repeats on purpose (max_tokens bounds the length): xgrammar needs about 4 s to
# compile `{1,400}` on these 2 cores, past vLLM's 5 s limit under load, and 0.02 s for `+`.
STRUCTURED_TEXT_REGEX = r"THOUGHT: [^\n`]+\n\n```bash\n[^`\n][^`]*\n```"
OBSERVATION_TEMPLATE = (
    "{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
    "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>"
)


class ChatModelConfig(BaseModel):
    """How to reach the model and how its turns look."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    model_name: str = "target"
    api_key: str = "unused"
    protocol: Literal["tool_calls", "text"] = "tool_calls"
    reasoning_mode: Literal["native", "tagged-visible"] = "native"
    structured_text: bool = False
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int | None = 0
    request_timeout_s: float = 1800.0
    extra_body: dict[str, Any] = {}
    tools: list[dict[str, Any]] | None = None
    """Decision tasks: these tool schemas instead of `bash` (see `histories.decision_actions`)."""
    action_regex: str = ACTION_REGEX
    structured_regex: str = STRUCTURED_TEXT_REGEX
    observation_template: str = OBSERVATION_TEMPLATE
    format_error_template: str = (
        "Format error: {{error}}. Reply with one THOUGHT line and exactly one ```bash block."
    )


@dataclass(frozen=True)
class RequestRecord:
    """One model request as it happened. Times are clock seconds; nothing is rounded."""

    request_id: str
    model: str
    sent_s: float
    first_token_s: float | None
    end_s: float
    chunk_times_s: list[float]
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    finish_reason: str | None
    status: Literal["ok", "error"] = "ok"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Stream:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    chunk_times: list[float] = field(default_factory=list)
    usage: Any = None
    finish_reason: str | None = None


class ChatModel:
    """mini-swe-agent `Model` protocol over the `openai` client, streaming, with records."""

    def __init__(
        self,
        config: ChatModelConfig,
        *,
        clock: Clock = monotonic,
        on_request: Callable[[RequestRecord], None] | None = None,
        policy: HistoryPolicy | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_request = on_request
        self.policy = policy
        self.records: list[RequestRecord] = []
        self.rewrite_s = 0.0  # time spent in policy.prepare, kept apart from request time
        self.client = OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0,
                             timeout=config.request_timeout_s)

    # --- mini-swe-agent Model protocol -------------------------------------------------------
    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        if self.policy is not None:
            started = self.clock()
            messages = self.policy.prepare(messages)
            self.rewrite_s += self.clock() - started
        stream, record = self._stream(self.api_messages(messages))
        message = self._assistant_message(stream)
        extra: dict[str, Any] = {"request": record.to_json(), "cost": 0.0,
                                 "timestamp": time.time()}
        try:
            extra["actions"] = self._parse_actions(message, stream.finish_reason)
        except FormatError as exc:
            exc.messages[0]["extra"].update({**extra, "response": message})
            raise
        message["extra"] = extra
        return message

    def format_message(self, **kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    def format_observation_messages(
        self, message: dict[str, Any], outputs: list[dict[str, Any]],
        template_vars: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        if self.config.protocol == "tool_calls":
            return format_toolcall_observation_messages(
                actions=message.get("extra", {}).get("actions", []), outputs=outputs,
                observation_template=self.config.observation_template,
                template_vars=template_vars)
        return format_observation_messages(
            outputs, observation_template=self.config.observation_template,
            template_vars=template_vars)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return self.config.model_dump()

    def serialize(self) -> dict[str, Any]:
        cfg = self.config.model_dump(mode="json", exclude={"api_key"})
        return {"info": {"config": {"model": cfg,
                                    "model_type": f"{__name__}.{type(self).__name__}"}}}

    # --- internals ------------------------------------------------------------------------
    def api_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What goes on the wire: no `extra`, no exit messages; reasoning only in native mode."""
        out = []
        for msg in messages:
            if msg.get("role") == "exit":
                continue
            wire = {k: v for k, v in msg.items() if k != "extra"}
            if self.config.reasoning_mode != "native":
                wire.pop("reasoning", None)
            out.append(wire)
        return out

    def request_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat-completions arguments for `messages` (already in wire form)."""
        body: dict[str, Any] = {
            "model": self.config.model_name, "messages": messages,
            "temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.config.seed is not None:
            body["seed"] = self.config.seed
        extra_body = dict(self.config.extra_body)
        if self.config.protocol == "tool_calls":
            body["tools"] = self.config.tools if self.config.tools is not None else [BASH_TOOL]
        elif self.config.structured_text:
            extra_body["structured_outputs"] = {"regex": self.config.structured_regex}
        if extra_body:
            body["extra_body"] = extra_body
        return body

    def _stream(self, messages: list[dict[str, Any]]) -> tuple[_Stream, RequestRecord]:
        body = self.request_body(messages)  # built before the clock starts
        request_id = uuid.uuid4().hex
        got = _Stream()
        sent = self.clock()
        try:
            for chunk in self.client.chat.completions.create(**body):
                now = self.clock()
                if chunk.usage is not None:
                    got.usage = chunk.usage
                if not chunk.choices:
                    continue
                got.chunk_times.append(now)
                choice = chunk.choices[0]
                got.finish_reason = choice.finish_reason or got.finish_reason
                _absorb(got, choice.delta)
        except Exception as exc:
            record = self._record(request_id, sent, got, status="error",
                                  error=f"{type(exc).__name__}: {exc}")
            raise
        record = self._record(request_id, sent, got)
        return got, record

    def _record(self, request_id: str, sent: float, got: _Stream, *,
                status: Literal["ok", "error"] = "ok", error: str | None = None) -> RequestRecord:
        usage = got.usage
        details = getattr(usage, "prompt_tokens_details", None)
        completion_details = getattr(usage, "completion_tokens_details", None)
        record = RequestRecord(
            request_id=request_id, model=self.config.model_name, sent_s=sent,
            first_token_s=got.chunk_times[0] if got.chunk_times else None, end_s=self.clock(),
            chunk_times_s=got.chunk_times,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            cached_tokens=getattr(details, "cached_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            reasoning_tokens=getattr(completion_details, "reasoning_tokens", None),
            finish_reason=got.finish_reason, status=status, error=error)
        self.records.append(record)
        if self.on_request is not None:
            self.on_request(record)
        return record

    def _assistant_message(self, got: _Stream) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(got.content)}
        reasoning = "".join(got.reasoning)
        if reasoning:
            message["reasoning"] = reasoning
        if got.tool_calls:
            message["tool_calls"] = [got.tool_calls[i] for i in sorted(got.tool_calls)]
        return message

    def _parse_actions(self, message: dict[str, Any], finish: str | None) -> list[dict[str, Any]]:
        kwargs = {"format_error_template": self.config.format_error_template,
                  "template_kwargs": {"finish_reason": finish}}
        if self.config.tools is not None:
            return parse_decision_actions(
                message, self.config.protocol, finish_reason=finish,
                format_error_template=self.config.format_error_template)
        if self.config.protocol == "tool_calls":
            calls = [ChatCompletionMessageToolCall.model_validate(c)
                     for c in message.get("tool_calls", [])]
            return parse_toolcall_actions(calls, **kwargs)  # type: ignore[arg-type]
        return parse_regex_actions(message["content"], action_regex=self.config.action_regex,
                                   **kwargs)  # type: ignore[arg-type]


def _absorb(got: _Stream, delta: Any) -> None:
    if delta.content:
        got.content.append(delta.content)
    extra = delta.model_extra or {}
    reasoning = extra.get("reasoning") or extra.get("reasoning_content")
    if reasoning:
        got.reasoning.append(reasoning)
    for call in delta.tool_calls or []:
        slot = got.tool_calls.setdefault(
            call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if call.id:
            slot["id"] = call.id
        if call.function is not None:
            slot["function"]["name"] += call.function.name or ""
            slot["function"]["arguments"] += call.function.arguments or ""


def config_for_profile(profile: Profile, base_url: str, seed: int = 0) -> ChatModelConfig:
    """The agent's model settings for a server profile: native tool calls for models that have
    them; text actions forced by structured outputs for small models that do not."""
    text = not profile.model.tool_calls
    return ChatModelConfig(
        base_url=base_url, model_name=profile.model.target_name,
        api_key=os.environ.get("API_KEY") or "unused",
        protocol="text" if text else "tool_calls", reasoning_mode=profile.model.reasoning,
        structured_text=text, seed=seed, temperature=0.7, max_tokens=256 if text else 4096)
