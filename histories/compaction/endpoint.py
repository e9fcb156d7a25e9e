"""One chat completion from any OpenAI-compatible endpoint, for compressors and judges.

Sent through the suite's one streaming client (`transport.client`), so a rewrite is timed the way
every other request is and its record can go to the run's `requests.jsonl` (source
`<arm>/compressor`). A rewrite is consumed whole: its latency (send to last byte) is what the
ledger records. The API key comes from the environment variable the config names, never from a
file. Anything that goes wrong in the request, including a 200 answer that is not a chat
completion, becomes `CompletionError` naming the URL: callers record it at the per-block boundary.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compaction_bench.common.net import api_url
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.transport.client import RequestRecord, StreamClient, prepare


class EndpointConfig(BaseModel):
    """Where a compressor or judge model is reached, and how it samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_url: str  # with or without /v1; normalized to the /v1 form
    model: str = "compressor"
    api_key_env: str = "COMPRESSOR_API_KEY"  # unset: the local server needs no key
    temperature: float = 0.0
    seed: int | None = 0
    request_timeout_s: float = Field(default=600.0, gt=0, description="inactivity deadline")
    extra_body: dict[str, Any] = {}

    @field_validator("api_url")
    @classmethod
    def _normalize(cls, value: str) -> str:
        return api_url(value)


class CompletionError(RuntimeError):
    """The endpoint did not return a usable chat completion."""


@dataclass(frozen=True)
class Completion:
    text: str
    reasoning: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    latency_s: float
    record: RequestRecord | None = None


RecordSink = Callable[[RequestRecord], None]


def complete(config: EndpointConfig, messages: list[dict[str, str]], *, max_tokens: int,
             clock: Clock = monotonic, seed: int | None = None,
             on_record: RecordSink | None = None) -> Completion:
    """Send one chat completion and return its text, usage and latency. `seed` overrides the
    config's sampling seed; `on_record` receives the request's record, failed or not."""
    body: dict[str, Any] = {"model": config.model, "messages": messages,
                            "temperature": config.temperature, "max_tokens": max_tokens,
                            **config.extra_body}
    chosen = seed if seed is not None else config.seed
    if chosen is not None:
        body["seed"] = chosen
    client = StreamClient(read_timeout_s=config.request_timeout_s, clock=clock)
    try:
        response = client.send(prepare(config.api_url, body, request_id=uuid.uuid4().hex,
                                       api_key=os.environ.get(config.api_key_env) or None))
    finally:
        client.close()
    record = response.record.labelled(seed=chosen)
    if on_record is not None:
        on_record(record)
    if not record.ok:
        raise CompletionError(
            f"{config.api_url} (model {config.model!r}): {record.error}; is the compressor "
            "server running (`make serve`, or the profile cpu-gemma-compressor)?")
    latency = (record.end_s or record.sent_s) - record.sent_s
    return Completion(
        text=response.content, reasoning=response.reasoning,
        finish_reason=record.finish_reason, prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens, reasoning_tokens=record.reasoning_tokens,
        latency_s=latency, record=record)
