"""The server's own endpoints, through one client: `/health`, `/v1/models`, `/version`,
`/metrics` (its text, the bench's fields and the engine's cache config) and `/tokenize` /
`/detokenize`. Chat requests are not sent here: they go through the measured streaming client
(`transport.client`), which stamps every chunk.

What a server other than vLLM may lack (`/health`, `/version`, the `vllm:*` metrics) reads as
"not stated": `healthy()` is False, `version()` and `models()` None, `cache_config()` {}.
What a caller cannot do without (the `/metrics` text for a sampler, tokens for an audit or a
probe) raises `EndpointError`, its message naming the URL and what came back.

`/metrics` is vLLM's Prometheus exposition, read with prometheus_client's parser:
- `parse_metrics` gives the bench's fields (`FIELDS`: vLLM's names, serve/engines/vllm_wire.py),
  summed over label sets (model names, engines), None for a metric the server does not export;
- `cache_config` gives the labels of the `vllm:cache_config_info` gauge: the engine's effective
  cache arguments (block size, prefix caching, retention interval, KV blocks).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.net import api_url, server_url
from compaction_bench.serve.engines.vllm_wire import CACHE_CONFIG_METRIC
from compaction_bench.serve.engines.vllm_wire import METRICS as FIELDS


class EndpointError(SuiteError):
    """A server endpoint the caller needs did not answer as it should."""


def parse_metrics(text: str) -> dict[str, float | None]:
    """The fields of `FIELDS` from a Prometheus text exposition (summed over label sets)."""
    # keyed by sample name, so exports with and without `# TYPE` lines read the same
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    out: dict[str, float | None] = {}
    for name, (families, suffix) in FIELDS.items():
        out[name] = next((sums[f + suffix] for f in families if f + suffix in sums), None)
    return out


def cache_config(metrics_text: str | None) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` (engine 0), or {} where the text has none."""
    if not metrics_text:
        return {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == CACHE_CONFIG_METRIC:
            for sample in family.samples:
                return dict(sample.labels)
    return {}


class ServerEndpoints:
    """One server's own endpoints (module docstring), over one kept-alive connection.

    `url` with or without `/v1`; `api_key` is sent as a bearer token (vLLM's `--api-key`
    guards `/v1/*` only, the rest answers without it); `timeout_s` bounds each call.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.server_url = server_url(url)
        self.api_url = api_url(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServerEndpoints:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _get(self, path: str) -> httpx.Response | None:
        try:
            return self._client.get(self.server_url + path)
        except httpx.HTTPError:
            return None

    def _json(self, path: str) -> Any:
        reply = self._get(path)
        if reply is None or reply.status_code != 200:
            return None
        try:
            return reply.json()
        except ValueError:
            return None

    def healthy(self) -> bool:
        """Whether `/health` answers 200."""
        reply = self._get("/health")
        return reply is not None and reply.status_code == 200

    def models(self) -> list[dict[str, Any]] | None:
        """What `/v1/models` lists (id, root, max_model_len, ...), or None without an answer."""
        body = self._json("/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None

    def version(self) -> str | None:
        """vLLM's `/version`, or None where the server has none."""
        body = self._json("/version")
        found = body.get("version") if isinstance(body, dict) else None
        return None if found is None else str(found)

    def metrics_text(self) -> str:
        """The `/metrics` exposition; `EndpointError` where there is none."""
        url = self.server_url + "/metrics"
        try:
            reply = self._client.get(url)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{type(exc).__name__} scraping {url}: {exc}") from exc
        if reply.status_code != 200:
            raise EndpointError(f"{url} answered HTTP {reply.status_code}")
        return reply.text

    def metrics(self) -> dict[str, float | None]:
        """The bench's fields from `/metrics` (`parse_metrics`); `EndpointError` as above or
        where the text is not a Prometheus exposition."""
        text = self.metrics_text()
        try:
            return parse_metrics(text)
        except ValueError as exc:
            raise EndpointError(f"{self.server_url}/metrics is not a Prometheus exposition: "
                                f"{exc}") from exc

    def cache_config(self) -> dict[str, str]:
        """The engine's cache arguments (`cache_config`), or {} where it states none."""
        try:
            return cache_config(self.metrics_text())
        except (EndpointError, ValueError):
            return {}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.server_url + path
        try:
            reply = self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if reply.status_code != 200:
            raise EndpointError(f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}")
        try:
            data = reply.json()
        except ValueError as exc:
            raise EndpointError(f"{url} answered with no JSON: {reply.text[:300]!r}") from exc
        if not isinstance(data, dict):
            raise EndpointError(f"{url} answered {data!r:.300}, not a JSON object")
        return data

    def _tokens(self, body: dict[str, Any]) -> list[int]:
        tokens = self._post("/tokenize", body).get("tokens")
        if not isinstance(tokens, list):
            raise EndpointError(f"{self.server_url}/tokenize returned no token list")
        return [int(t) for t in tokens]

    def tokenize_chat(self, model: str, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The token ids of a chat prompt as the server renders it (generation prompt added)."""
        body: dict[str, Any] = {"model": model, "messages": messages,
                                "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        return self._tokens(body)

    def tokenize_text(self, model: str, text: str) -> list[int]:
        """The token ids of plain text (no special tokens)."""
        return self._tokens({"model": model, "prompt": text, "add_special_tokens": False})

    def count_tokens(self, model: str, text: str) -> int:
        """How many tokens `text` is to the served model (0 for no text, nothing sent)."""
        return len(self.tokenize_text(model, text)) if text else 0

    def detokenize(self, model: str, tokens: list[int]) -> str:
        """The text of `tokens` ("" for none, nothing sent)."""
        if not tokens:
            return ""
        text = self._post("/detokenize", {"model": model, "tokens": tokens}).get("prompt")
        if not isinstance(text, str):
            raise EndpointError(f"{self.server_url}/detokenize returned no prompt text")
        return text


def is_healthy(url: str, timeout_s: float = 3.0) -> bool:
    """Whether the server at `url` (with or without /v1) answers /health with 200."""
    with ServerEndpoints(url, timeout_s=timeout_s) as server:
        return server.healthy()


def server_version(url: str) -> str | None:
    """vLLM's `/version` of the server at `url` (either form), or None where it has none."""
    with ServerEndpoints(url, timeout_s=10.0) as server:
        return server.version()
