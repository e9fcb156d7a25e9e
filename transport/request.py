"""The request types of the suite's one client: `RequestRecord`, the one record of a request
(arms, compressors, background alike; the `requests.jsonl` line), `Response` (a record and the
message it streamed), and `PreparedRequest` / `prepare` (a body serialized before the clock
starts)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

CHAT_PATH = "/chat/completions"
# The session header: vLLM's router keys `consistent_hash` (and its other session-affine
# policies) on it first (vllm-router 0.1.17, src/policies/hash_key.rs). One agent, one id.
SESSION_HEADER = "X-Session-Id"


@dataclass(frozen=True)
class RequestRecord:
    """One request as it happened: the `requests.jsonl` line, for arms, compressors and
    background alike (bench/analysis/summary_schema.md). Times are clock seconds: absolute as
    the client stamps them, relative to the run's start once `shifted`. Nothing is rounded.

    `source` says who sent it: an arm name, `<arm>/compressor`, `background` or `probe`.
    `session_id` is the agent's stable id, sent as `X-Session-Id` (what a router's
    session-affine policy keys on); None when the sender is no agent.
    `labels` holds what the sender adds (attempt, seed, history turn, body hash, ...).
    """

    request_id: str
    sent_s: float
    status: str = "error"  # ok | error
    source: str = ""
    regime: str = ""
    block: int | None = None
    model: str | None = None  # the model asked for
    # the model the response names (its `model` field): which model answered, as the server
    # says (vLLM names its first served name whatever alias was asked)
    served_model: str | None = None
    intended_send_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times_s: tuple[float, ...] = ()
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    error: str | None = None
    http_status: int | None = None
    finish_reason: str | None = None
    text_chars: int = 0
    session_id: str | None = None
    # speculative decoding, as the response states it (vLLM's per-request metrics, served with
    # --per-request-spec-decode-metrics): steps, draft_tokens, accepted_tokens, spec_tokens;
    # None where the server ran none or did not say
    spec_decode: dict[str, int] | None = None
    labels: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def shifted(self, origin_s: float) -> RequestRecord:
        """The same record with every time counted from `origin_s` (the run's start)."""
        def rel(value: float | None) -> float | None:
            return None if value is None else value - origin_s

        return dataclasses.replace(
            self, sent_s=self.sent_s - origin_s, intended_send_s=rel(self.intended_send_s),
            first_token_s=rel(self.first_token_s), end_s=rel(self.end_s),
            chunk_times_s=tuple(t - origin_s for t in self.chunk_times_s))

    def labelled(self, **identity: Any) -> RequestRecord:
        """A copy with record fields (source, regime, block, ...) set; unknown keys go to
        `labels`."""
        names = {f.name for f in dataclasses.fields(self)}
        own = {k: v for k, v in identity.items() if k in names}
        extra = {k: v for k, v in identity.items() if k not in names}
        return dataclasses.replace(self, **own, labels={**self.labels, **extra})

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["chunk_times_s"] = list(self.chunk_times_s)
        return data


@dataclass(frozen=True)
class Response:
    """A request's record and the assistant message it streamed (content, reasoning, calls)."""

    record: RequestRecord
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()

    def message(self) -> dict[str, Any]:
        """The assistant message in OpenAI form (reasoning and tool calls only when present)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [dict(c) for c in self.tool_calls]
        return message


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready to send: the body is already bytes, so no serialization is timed."""

    url: str
    body: bytes
    request_id: str
    intended_send_s: float | None = None
    stream: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    model: str | None = None
    session_id: str | None = None

    @property
    def body_sha256(self) -> str:
        """sha256 of the exact bytes sent (the invariant compares bodies on the wire)."""
        return hashlib.sha256(self.body).hexdigest()


def chat_url(api_url: str) -> str:
    """`http://host:port/v1` (the OpenAI base URL) -> its chat completions URL."""
    return api_url.rstrip("/") + CHAT_PATH


def prepare(api_url: str, payload: dict[str, Any], *, request_id: str,
            intended_send_s: float | None = None, api_key: str | None = None,
            session_id: str | None = None) -> PreparedRequest:
    """Serialize a chat request once. Streaming requests ask for usage in the last chunk; an
    `api_key` becomes a Bearer `Authorization` header, a `session_id` the `X-Session-Id`
    header (and the record's `session_id`)."""
    body = dict(payload)
    stream = bool(body.setdefault("stream", True))
    if stream:
        options = dict(body.get("stream_options") or {})
        options.setdefault("include_usage", True)
        body["stream_options"] = options
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    headers: tuple[tuple[str, str], ...] = (
        (("Authorization", f"Bearer {api_key}"),) if api_key else ())
    if session_id:
        headers += ((SESSION_HEADER, session_id),)
    model = body.get("model")
    return PreparedRequest(url=chat_url(api_url), body=data, request_id=request_id,
                           intended_send_s=intended_send_s, stream=stream, headers=headers,
                           model=model if isinstance(model, str) else None,
                           session_id=session_id or None)
