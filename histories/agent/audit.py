"""Render audit: what a server's chat template keeps of old reasoning, and where the prompt of
one request stops being a prefix of the next.

Two consecutive requests of a history are rendered through the server's `/tokenize`: the
request that produced the fork turn (A) and the first postfork request (B). If A's tokens are
not a prefix of B's, the template re-renders old turns (typically dropping their reasoning) and
the prefix cache breaks there. Each reasoning block is looked up in B's rendered text: a block
the template drops cannot be changed by compaction, so a compact arm would be a no-op with this
model and template.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from minisweagent.models.utils.actions_toolcall import BASH_TOOL

from common.errors import SuiteError
from common.net import api_url, server_url
from histories.agent.chat import ChatModel, ChatModelConfig
from histories.agent.continuation import pending_observation
from histories.format.history import History


class AuditError(SuiteError):
    """The server could not render a request (no /tokenize, or it refused the messages)."""


@dataclass(frozen=True)
class AuditResult:
    task: str
    arm: str
    model: str
    tokens_a: int
    tokens_b: int
    common_prefix_tokens: int
    a_is_prefix_of_b: bool
    reasoning_blocks: int
    reasoning_blocks_kept: int
    kept: list[bool]
    divergence_text: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        prefix = ("A is a prefix of B: the cache can reuse all of A" if self.a_is_prefix_of_b else
                  f"B diverges from A after {self.common_prefix_tokens} tokens: "
                  f"{self.divergence_text!r}")
        return (f"{self.task}/{self.arm} on '{self.model}': request A {self.tokens_a} tokens, "
                f"request B {self.tokens_b} tokens; {prefix}. The template keeps "
                f"{self.reasoning_blocks_kept} of {self.reasoning_blocks} reasoning blocks in B"
                + ("" if self.reasoning_blocks_kept else
                   " (compacting reasoning cannot change what this model sees)"))


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def audit(history: History, url: str, *, model: str = "target",
          api_key: str | None = None) -> AuditResult:
    """Render the fork turn's request and the first postfork request through `/tokenize`."""
    if history.fork is None:
        raise AuditError(f"history of task {history.task} has no fork to audit")
    wire = ChatModel(ChatModelConfig(api_url=api_url(url), model_name=model, api_key=api_key,
                                     protocol=history.action_protocol,  # type: ignore[arg-type]
                                     reasoning_mode=history.reasoning_mode))  # type: ignore[arg-type]
    fork = history.fork.message_index
    request_a = wire.api_messages(history.messages[:fork])
    request_b = wire.api_messages([*history.messages[: fork + 1], pending_observation(history)])
    root = server_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    tools = (history.tools or [BASH_TOOL]) if history.action_protocol == "tool_calls" else None
    with httpx.Client(timeout=120, headers=headers) as client:
        tokens_a = _tokenize(client, root, model, request_a, tools)
        tokens_b = _tokenize(client, root, model, request_b, tools)
        common = 0
        for x, y in zip(tokens_a, tokens_b, strict=False):
            if x != y:
                break
            common += 1
        text_b = _detokenize(client, root, model, tokens_b)
        divergence = _detokenize(client, root, model, tokens_b[common : common + 12])
    blocks = [text for index, text in history.reasoning_blocks() if index <= fork]
    rendered = _norm(text_b)
    kept = [_norm(text)[:200] in rendered for text in blocks if _norm(text)]
    return AuditResult(
        task=history.task, arm=history.arm, model=model, tokens_a=len(tokens_a),
        tokens_b=len(tokens_b), common_prefix_tokens=common,
        a_is_prefix_of_b=common == len(tokens_a), reasoning_blocks=len(kept),
        reasoning_blocks_kept=sum(kept), kept=kept, divergence_text=divergence)


def _tokenize(client: httpx.Client, root: str, model: str, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None) -> list[int]:
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    reply = client.post(f"{root}/tokenize", json=body)
    if reply.status_code != 200:
        raise AuditError(f"{root}/tokenize answered {reply.status_code}: {reply.text[:300]}")
    return [int(t) for t in reply.json()["tokens"]]


def _detokenize(client: httpx.Client, root: str, model: str, tokens: list[int]) -> str:
    if not tokens:
        return ""
    reply = client.post(f"{root}/detokenize", json={"model": model, "tokens": tokens})
    reply.raise_for_status()
    return str(reply.json()["prompt"])
