"""Server probes: what a prefill token and a decode step cost on a live OpenAI-compatible vLLM.

Both probes send chat requests through the suite's one client (`transport.client.StreamClient`)
and keep every request's raw record; what they read from the server itself (`/tokenize`, the
KV block from `/metrics`, `max_model_len` from `/v1/models`) comes through `serve.endpoints`.
Prompts are random lowercase letters (" q w e ..."), one token per letter in the BPE tokenizers
of the shipped models (checked against the server's `/tokenize` before anything is sent), drawn
from a seeded generator so a rerun neither hits the previous run's cache nor depends on global
state.

Prefill (`prefill_levels`): time to first token for `u` uncached tokens after `P` tokens that are
in the prefix cache. For each P a prefix of exactly P prompt tokens (chat header included) is
warmed by one request; each measured request repeats that prefix and continues with fresh
letters, so the cache can serve exactly P tokens and no more (P is a multiple of the server's KV
block, read from `/metrics`). The split actually served is read back from each response's
`usage.prompt_tokens_details.cached_tokens`: the fits use what the server reports (u = prompt
- cached, P = cached), and a level whose reported split differs from the planned one says so.

Decode (`decode_levels`): inter-token time for `b` concurrent streams at context L. Each of b
prompts of L + 1 tokens is warmed first, so in the measured round only its last token is
prefilled (vLLM always computes a prompt's last token) and the b streams decode together from
their first step; they start behind a barrier and generate `decode_tokens` tokens each
(`ignore_eos`). A stream's decode step time is (last token - first token) / (tokens - 1): the
mean over its steps, robust to vLLM sending several tokens in one event when it falls behind.
The level's mean context is the prompt length plus half the tokens generated.

Both probes warm everything first and then run the measured requests of all levels in one
seeded random order: the host's load changes over a sweep (other tenants of a shared machine),
and a fixed order would turn that drift into a trend across levels.
"""

from __future__ import annotations

import string
import threading
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median, median_low
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.errors import SuiteError
from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.client import StreamClient, prepare
from compaction_bench.transport.request import RequestRecord

LETTERS = string.ascii_lowercase
Say = Callable[[str], None]


class ProbeError(SuiteError):
    """The server cannot be probed as planned (tokenizer, block size, context length)."""


class ProbeConfig(BaseModel):
    """The probe's sweep. Token counts are prompt tokens as the server counts them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_url: str
    model: str = "target"
    prefill_uncached: list[int] = Field(default=[128, 512, 1024, 2048], min_length=1)
    prefill_cached: list[int] = Field(default=[0, 1024, 3072], min_length=1)
    prefill_reps: int = Field(default=3, ge=1)
    decode_batches: list[int] = Field(default=[1, 2, 3, 4], min_length=1)
    decode_contexts: list[int] = Field(default=[128, 1024, 3072], min_length=1)
    decode_tokens: int = Field(default=32, ge=3)
    decode_reps: int = Field(default=3, ge=1)
    block_size: int | None = Field(default=None, gt=0,
                                   description="KV block size; None: read from /metrics")
    seed: int = 0
    read_timeout_s: float = Field(default=600.0, gt=0)


@dataclass(frozen=True)
class ServerFacts:
    """What the probe reads from the server before sending anything."""

    block_size: int
    max_model_len: int | None
    kv_cache_tokens: int | None
    header_tokens: int  # chat-template tokens before the user's content
    trailer_tokens: int  # chat-template tokens after it (end of turn, assistant header)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tokenize(server: ServerEndpoints, model: str, content: str) -> list[int]:
    try:
        return server.tokenize_chat(model, [{"role": "user", "content": content}])
    except EndpointError as exc:
        raise ProbeError(f"{exc}; the probe needs vLLM's /tokenize endpoint") from exc


def letters(rng: np.random.Generator, n: int) -> str:
    """`n` random one-token words: ' x' for random lowercase letters x."""
    return "".join(" " + LETTERS[i] for i in rng.integers(0, len(LETTERS), size=max(n, 0)))


def server_facts(config: ProbeConfig, rng: np.random.Generator) -> ServerFacts:
    """Block size, limits and the chat template's token overhead; checks one token per letter."""
    with ServerEndpoints(config.api_url, timeout_s=30.0) as server:
        return _facts(config, rng, server)


def _facts(config: ProbeConfig, rng: np.random.Generator,
           server: ServerEndpoints) -> ServerFacts:
    base = server.server_url
    labels = server.cache_config()
    block = config.block_size or int(labels.get("block_size") or 0)
    if not block:
        raise ProbeError(f"{base}/metrics has no vllm:cache_config_info block_size; pass the "
                         "server's KV block size (--block-size)")
    first, second = _tokenize(server, config.model, " a"), _tokenize(server, config.model, " b")
    header = next((i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y),
                  None)
    if header is None or len(first) != len(second):
        raise ProbeError(f"{base}/tokenize: ' a' and ' b' render alike; cannot locate the "
                         "user content in the chat template")
    trailer = len(first) - header - 1
    sample = letters(rng, 64)
    if len(_tokenize(server, config.model, sample)) != header + 64 + trailer:
        raise ProbeError(f"model {config.model!r} at {base} does not tokenize ' a b c ...' as "
                         "one token per letter; the probe builds exact prompt lengths from that")
    try:
        max_len = next((int(m["max_model_len"]) for m in server.models() or []
                        if m.get("id") == config.model and m.get("max_model_len")), None)
    except (ValueError, TypeError):  # a max_model_len that is not a number: not stated
        max_len = None
    kv = labels.get("kv_cache_size_tokens")
    return ServerFacts(block_size=block, max_model_len=max_len,
                       kv_cache_tokens=int(kv) if kv and kv.isdigit() else None,
                       header_tokens=header, trailer_tokens=trailer)


def _payload(config: ProbeConfig, content: str, max_tokens: int) -> dict[str, Any]:
    # ignore_eos: every request generates exactly max_tokens; skip_special_tokens off: a
    # generated end-of-turn token still arrives as text, so every token is stamped (a stream
    # of special tokens alone would otherwise show no first token at all)
    return {"model": config.model, "messages": [{"role": "user", "content": content}],
            **dialect.length(max_tokens), "temperature": 0.0,
            **dialect.special_tokens_as_text()}


def _send(client: StreamClient, config: ProbeConfig, content: str, max_tokens: int,
          request_id: str) -> RequestRecord:
    request = prepare(config.api_url, _payload(config, content, max_tokens),
                      request_id=request_id)
    return client.send(request).record


def _check_plan(config: ProbeConfig, facts: ServerFacts) -> None:
    b = facts.block_size
    for p in config.prefill_cached:
        if p and (p % b or p < facts.header_tokens):
            raise ProbeError(f"prefill_cached {p}: must be 0 or a multiple of the server's KV "
                             f"block ({b} tokens) of at least the chat header "
                             f"({facts.header_tokens} tokens)")
    for u in config.prefill_uncached:
        if u <= facts.header_tokens + facts.trailer_tokens:
            raise ProbeError(f"prefill_uncached {u}: must exceed the chat template's "
                             f"{facts.header_tokens + facts.trailer_tokens} tokens")
    for ctx in config.decode_contexts:
        if ctx < facts.header_tokens + facts.trailer_tokens:
            raise ProbeError(f"decode_contexts {ctx}: shorter than the chat template "
                             f"({facts.header_tokens + facts.trailer_tokens} tokens)")
    longest = max(max(config.prefill_cached) + max(config.prefill_uncached),
                  max(config.decode_contexts) + 1 + config.decode_tokens)
    if facts.max_model_len is not None and longest > facts.max_model_len:
        raise ProbeError(f"the sweep needs {longest}-token sequences; the server's "
                         f"max_model_len is {facts.max_model_len}; lower the sweep")


def _ttft(record: RequestRecord) -> float | None:
    if not record.ok or record.first_token_s is None:
        return None
    return record.first_token_s - record.sent_s


def prefill_levels(config: ProbeConfig, facts: ServerFacts, rng: np.random.Generator,
                   say: Say) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(raw request records, one row per (u, P) level); see the module docstring. Every
    prefix is warmed first and the measured requests of all levels run in one shuffled
    order, so a change of the host's load over the sweep spreads over all levels instead of
    biasing the ones measured last."""
    _check_plan(config, facts)
    client = StreamClient(read_timeout_s=config.read_timeout_s)
    requests: list[dict[str, Any]] = []
    b, head, tail = facts.block_size, facts.header_tokens, facts.trailer_tokens
    prefixes = {p: letters(rng, p - head) if p else "" for p in config.prefill_cached}
    runs = [(p, u, rep) for p in config.prefill_cached for u in config.prefill_uncached
            for rep in range(config.prefill_reps)]
    rng.shuffle(runs)
    got: dict[tuple[int, int], list[RequestRecord]] = {(p, u): [] for p, u, _ in runs}
    try:
        for p, prefix in prefixes.items():
            if p:
                warm = _send(client, config, prefix, 1, f"kernels-warm-P{p}")
                requests.append({**warm.to_json(), "phase": "prefill-warm", "cached": p})
        for p, u, rep in runs:
            suffix = letters(rng, u - tail if p else u - tail - head)
            record = _send(client, config, prefixes[p] + suffix, 2,
                           f"kernels-prefill-u{u}-P{p}-r{rep}")
            requests.append({**record.to_json(), "phase": "prefill", "planned_uncached": u,
                             "planned_cached": p or head // b * b, "rep": rep})
            got[(p, u)].append(record)
    finally:
        client.close()
    levels = []
    for p in config.prefill_cached:
        for u in config.prefill_uncached:
            levels.append(_prefill_row(u, p or head // b * b, got[(p, u)], p))
            say(_describe_prefill(levels[-1]))
    return requests, levels


def _prefill_row(u: int, planned_cached: int, records: list[RequestRecord],
                 cached_level: int) -> dict[str, Any]:
    good = [r for r in records if _ttft(r) is not None and r.prompt_tokens is not None]
    ttfts = [_ttft(r) for r in good]
    cached = [r.cached_tokens or 0 for r in good]
    uncached = [(r.prompt_tokens or 0) - (r.cached_tokens or 0) for r in good]
    planned_prompt = planned_cached + u if cached_level else u
    split_ok = bool(good) and all(c == planned_cached for c in cached) and all(
        r.prompt_tokens == planned_prompt for r in good)
    return {"level": f"u={u},P={cached_level}", "planned_uncached": planned_prompt
            - planned_cached, "planned_cached": planned_cached,
            "uncached": median_low(uncached) if good else None,
            "cached": median_low(cached) if good else None,
            "ttft_s": [t for t in ttfts if t is not None],
            "median_s": median(t for t in ttfts if t is not None) if good else None,
            "n": len(good), "failed": len(records) - len(good), "split_ok": split_ok,
            "errors": sorted({r.error for r in records if r.error})}


def _describe_prefill(row: dict[str, Any]) -> str:
    if row["median_s"] is None:
        return f"[probe] prefill {row['level']}: every request failed: {row['errors'][:1]}"
    split = "" if row["split_ok"] else (f" (server split: {row['uncached']} uncached + "
                                        f"{row['cached']} cached, planned "
                                        f"{row['planned_uncached']} + {row['planned_cached']})")
    return (f"[probe] prefill u={row['uncached']:>5} P={row['cached']:>5}: TTFT median "
            f"{row['median_s'] * 1e3:8.1f} ms over n={row['n']}{split}")


def _decode_round(config: ProbeConfig, prompts: list[str], batch: int,
                  tag: str) -> list[RequestRecord]:
    """`batch` streams started together behind a barrier, each on its own connection."""
    barrier = threading.Barrier(batch)
    out: list[RequestRecord | None] = [None] * batch
    clients = [StreamClient(read_timeout_s=config.read_timeout_s) for _ in range(batch)]

    def stream(i: int) -> None:
        request = prepare(config.api_url, _payload(config, prompts[i], config.decode_tokens),
                          request_id=f"{tag}-s{i}")
        barrier.wait()
        out[i] = clients[i].send(request).record

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(batch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for client in clients:
        client.close()
    return [r for r in out if r is not None]


def step_time(record: RequestRecord) -> float | None:
    """Mean decode step of one stream: (last token - first token) / (tokens - 1)."""
    tokens = record.completion_tokens or 0
    if not record.ok or record.first_token_s is None or len(record.chunk_times_s) < 2 or (
            tokens < 2):
        return None
    return (record.chunk_times_s[-1] - record.first_token_s) / (tokens - 1)


def decode_levels(config: ProbeConfig, facts: ServerFacts, rng: np.random.Generator,
                  say: Say) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(raw request records, one row per (b, L) level); see the module docstring. All
    prompts are warmed first; the rounds of all levels then run in one shuffled order."""
    _check_plan(config, facts)
    requests: list[dict[str, Any]] = []
    widest = max(config.decode_batches)
    overhead = facts.header_tokens + facts.trailer_tokens
    prompts = {ctx: [letters(rng, ctx + 1 - overhead) for _ in range(widest)]
               for ctx in config.decode_contexts}
    rounds = [(ctx, batch, rep) for ctx in config.decode_contexts
              for batch in config.decode_batches for rep in range(config.decode_reps)]
    rng.shuffle(rounds)
    got: dict[tuple[int, int], list[RequestRecord]] = {(c, b): [] for c, b, _ in rounds}
    client = StreamClient(read_timeout_s=config.read_timeout_s)
    try:
        for ctx, texts in prompts.items():  # warm: each prompt's blocks into the cache
            for i, text in enumerate(texts):
                warm = _send(client, config, text, 1, f"kernels-warm-L{ctx}-s{i}")
                requests.append({**warm.to_json(), "phase": "decode-warm", "context": ctx})
    finally:
        client.close()
    for ctx, batch, rep in rounds:
        round_ = _decode_round(config, prompts[ctx], batch,
                               f"kernels-decode-b{batch}-L{ctx}-r{rep}")
        starts = [r.first_token_s for r in round_ if r.first_token_s is not None]
        spread = max(starts) - min(starts) if starts else None
        for r in round_:
            requests.append({**r.to_json(), "phase": "decode", "batch": batch,
                             "context": ctx, "rep": rep, "round_first_token_spread_s": spread})
        got[(ctx, batch)] += round_
    levels = []
    for ctx in config.decode_contexts:
        for batch in config.decode_batches:
            levels.append(_decode_row(batch, ctx, got[(ctx, batch)], config.decode_tokens,
                                      facts.block_size))
            say(_describe_decode(levels[-1]))
    return requests, levels


def _decode_row(batch: int, context: int, records: list[RequestRecord], tokens: int,
                block: int) -> dict[str, Any]:
    steps = [s for s in (step_time(r) for r in records) if s is not None]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    # warmed prompts: the cache serves every full block before the prompt's last token
    cold = [r.request_id for r in records if r.prompt_tokens is not None and (
        r.cached_tokens or 0) < (r.prompt_tokens - 1) // block * block]
    mean_context = (median_low(prompt) + tokens / 2.0) if prompt else None
    return {"level": f"b={batch},L={context}", "batch": batch, "context": context,
            "mean_context": mean_context, "step_s": steps,
            "median_s": median(steps) if steps else None, "n": len(steps),
            "failed": len(records) - len(steps), "uncached_streams": cold,
            "errors": sorted({r.error for r in records if r.error})}


def _describe_decode(row: dict[str, Any]) -> str:
    if row["median_s"] is None:
        return f"[probe] decode {row['level']}: no stream decoded: {row['errors'][:1]}"
    cold = (f" ({len(row['uncached_streams'])} streams missed the cache)"
            if row["uncached_streams"] else "")
    return (f"[probe] decode  b={row['batch']:>3} L={row['context']:>5}: step median "
            f"{row['median_s'] * 1e3:8.2f} ms over n={row['n']} streams{cold}")


def default_sweep(engine: str, max_num_seqs: int, *, quick: bool = False) -> dict[str, Any]:
    """ProbeConfig fields for a profile: a few minutes on the 2-core CPU server, a GPU sweep
    reaching the profile's sequence limit and long contexts (multiples of 256-token blocks).
    `quick`: 2-3 levels per phase, for tests and a first look."""
    if quick:
        return {"prefill_uncached": [128, 512], "prefill_cached": [0, 1024],
                "prefill_reps": 1, "decode_batches": [1, min(2, max_num_seqs)],
                "decode_contexts": [128], "decode_tokens": 8, "decode_reps": 1}
    if engine == "cpu":  # 5 repeats of a prefill level: one hiccup of a shared host cannot
        # move its median (about 3.5 minutes in all on 2 cores)
        return {"prefill_reps": 5,
                "decode_batches": sorted({b for b in (1, 2, 3, 4) if b <= max_num_seqs})}
    batches = sorted({b for b in (1, 4, 8, 16, 32, 64) if b <= max_num_seqs} | {max_num_seqs})
    return {"prefill_uncached": [512, 2048, 8192], "prefill_cached": [0, 8192, 32768],
            "prefill_reps": 3, "decode_batches": batches,
            "decode_contexts": [1024, 8192, 32768], "decode_tokens": 64, "decode_reps": 3}
