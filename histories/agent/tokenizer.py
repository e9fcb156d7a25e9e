"""The server's own tokenizer, through vLLM's `/tokenize` and `/detokenize`: one home for every
token count the suite takes from text rather than from usage fields (rendered chat prompts for
the render audit and cache-break accounting, tagged-visible reasoning for reasoning tokens)."""

from __future__ import annotations

from typing import Any

import httpx

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.net import server_url


class TokenizerError(SuiteError):
    """The server did not tokenize (no /tokenize, or it refused the input)."""


class Tokenizer:
    """A client of one server's tokenizer for one served model name."""

    def __init__(self, url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 120.0) -> None:
        self.root = server_url(url)
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self._client.post(f"{self.root}{path}", json=body)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"{self.root}{path}: {type(exc).__name__}: {exc}") from exc
        if reply.status_code != 200:
            raise TokenizerError(f"{self.root}{path} answered {reply.status_code}: "
                                 f"{reply.text[:300]}")
        data: dict[str, Any] = reply.json()
        return data

    def chat(self, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The token ids of a chat prompt as the server renders it (generation prompt added)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        return [int(t) for t in self._post("/tokenize", body)["tokens"]]

    def text(self, text: str) -> list[int]:
        """The token ids of plain text (no special tokens)."""
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in self._post("/tokenize", body)["tokens"]]

    def count(self, text: str) -> int:
        return len(self.text(text)) if text else 0

    def detokenize(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        return str(self._post("/detokenize", {"model": self.model, "tokens": tokens})["prompt"])
