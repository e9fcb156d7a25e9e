"""A mini-swe-agent `Model` that talks to any OpenAI-compatible server through the suite's one
streaming client (`transport.client`), the client `make bench-client` measures.

It streams every response and stamps each chunk on arrival (one monotonic clock), records every
request as a `RequestRecord` (prompt, cached, completion, reasoning tokens, the sampling seed and
the sha256 of the exact body sent), and supports two action protocols:

- `tool_calls`: a native `bash` tool; the model's reasoning field is sent back on later turns.
- `text`: one fenced bash block per turn (mini-swe-agent's text protocol). With
  `structured_text`, vLLM's structured outputs force a THOUGHT line and one fenced command, which
  is what lets a 135M model produce well-formed actions; the manifest records when it is used.

With `tools` set (decision tasks), the task's tools replace `bash` and replies are parsed by
`histories.tasks.decision_protocol` (tool calls of the task's tools, JSON text actions, FINAL
lines). A request that fails (connection, HTTP error, stalled stream) raises `TransportError`
after its record is kept: the continuation records the arm as failed, nothing is retried.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
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
from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.net import api_url
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.format.actions import BASH_ACTION_REGEX, STRUCTURED_TEXT_REGEX
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.tasks.decision_protocol import parse_decision_actions
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.serve.profile import Profile
from compaction_bench.transport.client import (
    PreparedRequest,
    RequestRecord,
    Response,
    StreamClient,
    prepare,
)

OBSERVATION_TEMPLATE = (
    "{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
    "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>"
)


class TransportError(RuntimeError):
    """A model request failed (connection, HTTP status, stalled or malformed stream)."""


class ChatModelConfig(BaseModel):
    """How to reach the model and how its turns look."""

    model_config = ConfigDict(extra="forbid")

    api_url: str
    model_name: str = "target"
    api_key: str | None = None
    protocol: Literal["tool_calls", "text"] = "tool_calls"
    reasoning_mode: Literal["native", "tagged-visible"] = "native"
    structured_text: bool = False
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None  # an engine extra (serve/engines/vllm_wire.py top_k)
    max_tokens: int = 512
    seed: int | None = Field(
        default=0, description="base sampling seed: the k-th request of a run sends seed + k, "
        "so requests differ from each other while a repeat with the same base is identical")
    request_timeout_s: float = Field(
        default=1800.0, gt=0, description="inactivity deadline: the longest silence tolerated "
        "on a stream (the first token of a queued request included)")
    extra_body: dict[str, Any] = {}
    session_id: str | None = None  # the agent's X-Session-Id (a router keeps it on one replica)
    tools: list[dict[str, Any]] | None = None
    """Decision tasks: these tool schemas, not `bash` (`histories.tasks.decision_protocol`)."""
    action_regex: str = BASH_ACTION_REGEX
    structured_regex: str = STRUCTURED_TEXT_REGEX
    observation_template: str = OBSERVATION_TEMPLATE
    format_error_template: str = (
        "Format error: {{error}}. Reply with one THOUGHT line and exactly one ```bash block."
    )


class ChatModel:
    """mini-swe-agent `Model` protocol over the suite's streaming client, with records.

    `on_request(record, request)` is called with every request's record (absolute clock times)
    and the prepared request (its exact bytes), as soon as the request ends, failed or not.
    """

    def __init__(
        self,
        config: ChatModelConfig,
        *,
        clock: Clock = monotonic,
        on_request: Callable[[RequestRecord, PreparedRequest], None] | None = None,
        policy: HistoryPolicy | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_request = on_request
        self.policy = policy
        self.records: list[RequestRecord] = []
        self.first_body: bytes | None = None  # the first request exactly as sent
        self.rewrite_s = 0.0  # time spent in policy.prepare, kept apart from request time
        self.waited_s = 0.0  # waiting in policy.prepare for a compressor server to start
        self.client = StreamClient(read_timeout_s=config.request_timeout_s, clock=clock)
        bind = getattr(policy, "bind", None)
        if callable(bind):  # a policy that sends its own request (histories/policies/inline.py)
            bind(self)

    # --- mini-swe-agent Model protocol -------------------------------------------------------
    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        if self.policy is not None:
            started = self.clock()
            waited = float(getattr(self.policy, "waited_s", 0.0))
            messages = self.policy.prepare(messages)
            # waiting for a compressor server to start is setup, not rewriting
            waited = float(getattr(self.policy, "waited_s", 0.0)) - waited
            self.rewrite_s += self.clock() - started - waited
            self.waited_s += waited
        response = self.request(self.api_messages(messages))
        message = response.message()
        extra: dict[str, Any] = {"request": response.record.to_json(), "cost": 0.0,
                                 "timestamp": time.time()}
        try:
            extra["actions"] = self._parse_actions(message, response.record.finish_reason)
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

    def close(self) -> None:
        self.client.close()

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

    def request_seed(self, index: int) -> int | None:
        """The sampling seed of this model's `index`-th request (from 0)."""
        return None if self.config.seed is None else self.config.seed + index

    def request_body(self, messages: list[dict[str, Any]], *,
                     index: int | None = None) -> dict[str, Any]:
        """The chat-completions body for `messages` (already in wire form), as sent as this
        model's `index`-th request (default: the next one)."""
        seed = self.request_seed(len(self.records) if index is None else index)
        body: dict[str, Any] = {
            "model": self.config.model_name, "messages": messages,
            "temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if seed is not None:
            body["seed"] = seed
        if self.config.top_p is not None:
            body["top_p"] = self.config.top_p
        body.update(dialect.top_k(self.config.top_k))
        if self.config.protocol == "tool_calls":
            body["tools"] = self.config.tools if self.config.tools is not None else [BASH_TOOL]
        elif self.config.structured_text:
            body["structured_outputs"] = {"regex": self.config.structured_regex}
        body.update(self.config.extra_body)
        return body

    def request(self, messages: list[dict[str, Any]]) -> Response:
        """Send one request for wire-form `messages` and return its response; its record goes
        to `records` and `on_request` first. A failed request raises `TransportError`."""
        request = prepare(self.config.api_url, self.request_body(messages),
                          request_id=uuid.uuid4().hex, api_key=self.config.api_key,
                          session_id=self.config.session_id)
        if self.first_body is None:
            self.first_body = request.body
        response = self.client.send(request)
        reply = json.dumps(response.message(), sort_keys=True, ensure_ascii=False)
        record = response.record.labelled(seed=self.request_seed(len(self.records)),
                                          body_sha256=request.body_sha256,
                                          reply_sha256=hashlib.sha256(reply.encode()).hexdigest())
        self.records.append(record)
        if self.on_request is not None:
            self.on_request(record, request)
        if not record.ok:
            raise TransportError(record.error or "request failed")
        return response

    def _parse_actions(self, message: dict[str, Any], finish: str | None) -> list[dict[str, Any]]:
        kwargs = {"format_error_template": self.config.format_error_template,
                  "template_kwargs": {"finish_reason": finish}}
        if self.config.tools is not None:
            return parse_decision_actions(
                message, self.config.protocol, finish_reason=finish,
                format_error_template=self.config.format_error_template)
        if self.config.protocol == "tool_calls":
            # imported here: openai's types cost about 1 s, paid by every CLI command otherwise
            from openai.types.chat import ChatCompletionMessageToolCall

            calls = [ChatCompletionMessageToolCall.model_validate(c)
                     for c in message.get("tool_calls", [])]
            return parse_toolcall_actions(calls, **kwargs)  # type: ignore[arg-type]
        return parse_regex_actions(message["content"], action_regex=self.config.action_regex,
                                   **kwargs)  # type: ignore[arg-type]


def config_for_profile(profile: Profile, url: str, seed: int = 0) -> ChatModelConfig:
    """The agent's model settings for a server profile: native tool calls for models that have
    them; text actions forced by structured outputs for small models that do not; sampling as
    the profile's model card says (`profile.sampling`).

    Without a `[sampling]` table the suite falls back to temperature 0.7 with tool calls and 1.0
    with forced text actions: SmolLM2 under forced actions is so peaked that at 0.7 the first
    postfork reply was the same for 19 of 20 seeds (at 1.0, 11 of 20), and blocks are
    independent repeats only where the sampler can vary."""
    text = not profile.model.tool_calls
    sampling = profile.sampling
    return ChatModelConfig(
        api_url=api_url(url), model_name=profile.model.target_name,
        api_key=os.environ.get("API_KEY") or None,
        protocol="text" if text else "tool_calls", reasoning_mode=profile.model.reasoning,
        structured_text=text, seed=seed,
        temperature=sampling.temperature if sampling else 1.0 if text else 0.7,
        top_p=sampling.top_p if sampling else None, top_k=sampling.top_k if sampling else None,
        max_tokens=256 if text else 4096)
