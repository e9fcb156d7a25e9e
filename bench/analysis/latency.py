"""Per-request latency and prefix-cache figures, and what the server's /metrics say about them.

All figures come from `requests.jsonl` (per request, attributable to an arm or to background
load) and `metrics.jsonl` (server-wide, attributable only to a time span).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from compaction_bench.bench.analysis.stats import Distribution, counter_delta, distribution
from compaction_bench.bench.runfolder import (
    MetricSample,
    RunRecords,
    arm_sort_key,
    regime_sort_key,
)
from compaction_bench.transport.client import RequestRecord

BACKGROUND = "background"


@dataclass(frozen=True)
class SourceLatency:
    """Latency distributions of one source (an arm or background) in one regime, in seconds.

    ttft: first_token_s - sent_s, the queue-time proxy (waiting plus prefill).
    inter_token: gaps between consecutive streamed chunks, pooled over requests.
    request_time: end_s - sent_s of requests that finished ok.
    send_lag: sent_s - intended_send_s; a large lag means the load generator, not the server,
    fell behind, so the offered load was lower than intended.
    """

    regime: str
    source: str
    n_requests: int
    n_errors: int
    ttft: Distribution
    inter_token: Distribution
    request_time: Distribution
    send_lag: Distribution
    ttft_values: tuple[float, ...]
    request_time_values: tuple[float, ...]


@dataclass(frozen=True)
class CacheRate:
    """Share of prompt tokens served from the prefix cache: sum cached / sum prompt tokens.

    Summing tokens (not averaging per-request rates) weights long prompts by their size, which
    is what the cache saves prefill work on. `n_requests` counts requests reporting both values.
    """

    regime: str
    source: str
    n_requests: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True)
class CacheCheck:
    """The regime's request-reported hit rate beside the server counters over its block spans.

    vLLM's prefix_cache_hits/queries count tokens server-wide, so they are compared with the
    rate over all sources (arms plus background). A gap points at requests without usage data
    or at traffic the run did not record.
    """

    regime: str
    n_spans: int
    from_requests: float | None
    from_metrics: float | None


def _group(requests: Sequence[RequestRecord]) -> dict[tuple[str, str], list[RequestRecord]]:
    groups: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for request in requests:
        groups[(request.regime, request.source)].append(request)
    return groups


def _source_key(key: tuple[str, str]) -> tuple[tuple[int, str], int, tuple[int, str]]:
    regime, source = key
    return (regime_sort_key(regime), int(source == BACKGROUND), arm_sort_key(source))


def latencies(records: RunRecords) -> tuple[SourceLatency, ...]:
    """Latency distributions per regime and source."""
    out = []
    groups = _group(records.requests)
    for key in sorted(groups, key=_source_key):
        rows = groups[key]
        ok = [r for r in rows if r.status == "ok"]
        ttft = [r.first_token_s - r.sent_s for r in ok if r.first_token_s is not None]
        total = [r.end_s - r.sent_s for r in ok if r.end_s is not None]
        gaps = [
            float(g) for r in ok if len(r.chunk_times_s) > 1 for g in np.diff(r.chunk_times_s)
        ]
        lag = [r.sent_s - r.intended_send_s for r in rows if r.intended_send_s is not None]
        out.append(SourceLatency(
            regime=key[0],
            source=key[1],
            n_requests=len(rows),
            n_errors=len(rows) - len(ok),
            ttft=distribution(ttft),
            inter_token=distribution(gaps),
            request_time=distribution(total),
            send_lag=distribution(lag),
            ttft_values=tuple(ttft),
            request_time_values=tuple(total),
        ))
    return tuple(out)


def _rate(regime: str, source: str, rows: Sequence[RequestRecord]) -> CacheRate:
    usable = [r for r in rows if r.prompt_tokens is not None and r.cached_tokens is not None]
    return CacheRate(
        regime=regime,
        source=source,
        n_requests=len(usable),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in usable),
        cached_tokens=sum(r.cached_tokens or 0 for r in usable),
    )


def cache_rates(records: RunRecords) -> tuple[CacheRate, ...]:
    """Prefix-cache hit rate per regime and source, plus an `all` row per regime."""
    groups = _group(records.requests)
    out = [_rate(k[0], k[1], groups[k]) for k in sorted(groups, key=_source_key)]
    for regime in sorted({k[0] for k in groups}, key=regime_sort_key):
        rows = [r for k, v in groups.items() if k[0] == regime for r in v]
        out.append(_rate(regime, "all", rows))
    return tuple(out)


def regime_spans(records: RunRecords) -> dict[str, list[tuple[float, float]]]:
    """Start/end of every block with both times, per regime."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for block in records.blocks:
        if block.started_s is not None and block.ended_s is not None:
            spans[block.regime].append((block.started_s, block.ended_s))
    return spans


def _in_span(samples: Sequence[MetricSample], span: tuple[float, float]) -> list[MetricSample]:
    return [s for s in samples if span[0] <= s.t_s <= span[1]]


def cache_checks(records: RunRecords) -> tuple[CacheCheck, ...]:
    """Per regime: request-reported hit rate vs counter deltas summed over its block spans."""
    samples = sorted(records.metrics, key=lambda s: s.t_s)
    rates = {c.regime: c.hit_rate for c in cache_rates(records) if c.source == "all"}
    out = []
    spans_by_regime = regime_spans(records)
    for regime in sorted(spans_by_regime, key=regime_sort_key):
        spans = spans_by_regime[regime]
        hits = queries = 0.0
        counted = False
        for span in spans:
            inside = _in_span(samples, span)
            h = counter_delta(
                [s.prefix_cache_hits for s in inside if s.prefix_cache_hits is not None]
            )
            q = counter_delta(
                [s.prefix_cache_queries for s in inside if s.prefix_cache_queries is not None]
            )
            if h is not None and q is not None:
                hits, queries, counted = hits + h, queries + q, True
        out.append(CacheCheck(
            regime=regime,
            n_spans=len(spans),
            from_requests=rates.get(regime),
            from_metrics=hits / queries if counted and queries > 0 else None,
        ))
    return tuple(out)


def max_waiting(records: RunRecords) -> Mapping[str, float | None]:
    """Largest num_requests_waiting seen: per regime (inside its block spans) and under `all`."""
    waiting = [(s.t_s, s.num_requests_waiting) for s in records.metrics
               if s.num_requests_waiting is not None]
    out: dict[str, float | None] = {"all": max((w for _, w in waiting), default=None)}
    for regime, spans in regime_spans(records).items():
        inside = [w for t, w in waiting if any(a <= t <= b for a, b in spans)]
        out[regime] = max(inside, default=None)
    return out
