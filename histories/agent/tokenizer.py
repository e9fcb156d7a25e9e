"""Temporary: the server's tokenizer bound to one served model name, for bench/run/replay.py,
which still imports `Tokenizer` and `TokenizerError` from here. The client is the one of the
server's own endpoints (`serve.endpoints.ServerEndpoints`: `tokenize_chat`, `tokenize_text`,
`count_tokens`, `detokenize`, raising `EndpointError`); this module only binds the model name
and goes once replay.py calls that directly."""

from __future__ import annotations

from typing import Any

from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints

TokenizerError = EndpointError


class Tokenizer:
    """`ServerEndpoints`' tokenizer calls with the model name bound."""

    def __init__(self, url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 120.0) -> None:
        self.model = model
        self.server = ServerEndpoints(url, api_key=api_key, timeout_s=timeout_s)

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def chat(self, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.server.tokenize_chat(self.model, messages, tools)

    def text(self, text: str) -> list[int]:
        return self.server.tokenize_text(self.model, text)

    def count(self, text: str) -> int:
        return self.server.count_tokens(self.model, text)

    def detokenize(self, tokens: list[int]) -> str:
        return self.server.detokenize(self.model, tokens)
