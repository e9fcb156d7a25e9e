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

from minisweagent.models.utils.actions_toolcall import BASH_TOOL

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.net import api_url
from compaction_bench.histories.agent.chat import ChatModel, ChatModelConfig
from compaction_bench.histories.agent.continuation import pending_observation
from compaction_bench.histories.format.history import History
from compaction_bench.serve.endpoints import ServerEndpoints
from compaction_bench.transport.prefixhash import common_prefix


class AuditError(SuiteError):
    """A history that cannot be audited (it has no fork)."""


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
    tools = (history.tools or [BASH_TOOL]) if history.action_protocol == "tool_calls" else None
    with ServerEndpoints(url, api_key=api_key, timeout_s=120.0) as server:
        tokens_a = server.tokenize_chat(model, request_a, tools)
        tokens_b = server.tokenize_chat(model, request_b, tools)
        common = common_prefix(tokens_a, tokens_b)
        text_b = server.detokenize(model, tokens_b)
        divergence = server.detokenize(model, tokens_b[common : common + 12])
    blocks = [text for index, text in history.reasoning_blocks() if index <= fork]
    rendered = _norm(text_b)
    kept = [_norm(text)[:200] in rendered for text in blocks if _norm(text)]
    return AuditResult(
        task=history.task, arm=history.arm, model=model, tokens_a=len(tokens_a),
        tokens_b=len(tokens_b), common_prefix_tokens=common,
        a_is_prefix_of_b=common == len(tokens_a), reasoning_blocks=len(kept),
        reasoning_blocks_kept=sum(kept), kept=kept, divergence_text=divergence)
