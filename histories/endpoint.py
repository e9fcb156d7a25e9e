"""One chat completion from any OpenAI-compatible endpoint, for compressors and judges.

Non-streaming on purpose: a rewrite is consumed whole, and its latency (send to last byte) is
what the ledger records. The API key comes from the environment variable the config names,
never from a file. Anything that goes wrong in the request, including a 200 answer that is not
a chat completion, becomes `EndpointError` naming the URL: callers record it at the per-block
boundary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from openai import OpenAI
from pydantic import BaseModel, ConfigDict

from histories.timing import Clock, monotonic


class EndpointConfig(BaseModel):
    """Where a compressor or judge model is reached, and how it samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    model: str = "compressor"
    api_key_env: str = "COMPRESSOR_API_KEY"  # unset: the local server needs no key
    temperature: float = 0.0
    seed: int | None = 0
    request_timeout_s: float = 600.0
    extra_body: dict[str, Any] = {}


class EndpointError(RuntimeError):
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


def client_for(config: EndpointConfig) -> OpenAI:
    """An `openai` client without its own retries: every attempt is a counted draft."""
    return OpenAI(base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "unused",
                  max_retries=0, timeout=config.request_timeout_s)


def complete(client: OpenAI, config: EndpointConfig, messages: list[dict[str, str]], *,
             max_tokens: int, clock: Clock = monotonic) -> Completion:
    """Send one chat completion and return its text, usage and latency."""
    body: dict[str, Any] = {"model": config.model, "messages": messages,
                            "temperature": config.temperature, "max_tokens": max_tokens}
    if config.seed is not None:
        body["seed"] = config.seed
    if config.extra_body:
        body["extra_body"] = dict(config.extra_body)
    sent = clock()
    try:
        response = client.chat.completions.create(**body)
        latency = clock() - sent
        choice = response.choices[0]
        content = choice.message.content
        if content is not None and not isinstance(content, str):
            raise TypeError(f"content is {type(content).__name__}, not a string")
    except Exception as exc:  # the per-request boundary: anything here is the endpoint's fault
        raise EndpointError(
            f"{config.base_url} (model {config.model!r}): {type(exc).__name__}: {exc}; is the "
            "compressor server running (`make serve`, or the profile cpu-gemma-compressor)?"
        ) from exc
    extra = choice.message.model_extra or {}
    reasoning = extra.get("reasoning") or extra.get("reasoning_content") or ""
    usage = response.usage
    details = getattr(usage, "completion_tokens_details", None)
    return Completion(
        text=content or "", reasoning=reasoning if isinstance(reasoning, str) else "",
        finish_reason=choice.finish_reason,
        prompt_tokens=getattr(usage, "prompt_tokens", None),
        completion_tokens=getattr(usage, "completion_tokens", None),
        reasoning_tokens=getattr(details, "reasoning_tokens", None), latency_s=latency)
