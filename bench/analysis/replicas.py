"""Per-replica accounting of a run made through a router, and the cache hit rate of the arms'
continuation requests: what `make bench ROUTER_POLICY=...` compares across policies.

Two sources, never mixed in one figure, each figure saying which it came from:

- counters (`replica_metrics.jsonl`, one line per replica per scrape): each replica's own
  `/metrics` (requests finished, prefix-cache queries and hits in tokens, queue time, requests
  waiting) and the router's own count of what it sent to each replica. Deltas over the run's
  scrapes, so they cover every request the replica served in that span, background included.
  The router's count is of HTTP requests (its /health and /v1/models probes count too).
- inferred requests: the run's own request records attributed to a replica by
  `loadgen.replica_metrics.infer_replicas` (exact for a request that ended alone, else left
  unattributed and counted as such), so their prompt and cached tokens are the records' own.

Pure functions of the records; reading the file is `read_replica_lines`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.analysis.latency import CacheRate
from compaction_bench.bench.analysis.stats import counter_delta
from compaction_bench.bench.runfolder import RunRecords, arm_sort_key, regime_sort_key
from compaction_bench.common.files import read_jsonl
from compaction_bench.loadgen.replica_metrics import REPLICA_METRICS, infer_replicas
from compaction_bench.transport.client import RequestRecord


@dataclass(frozen=True)
class ReplicaFigures:
    """One replica over the run's scrapes. Counter figures are None where fewer than two
    scrapes reported the counter; `inferred_*` count the run's records attributed to it."""

    replica: str
    samples: int
    failed_scrapes: int
    routed: float | None  # the router's count of HTTP requests it sent here
    finished: float | None  # requests the replica finished (its requests_finished counter)
    prompt_tokens: float | None  # prefix-cache queries (tokens looked up: the prompts)
    cached_tokens: float | None  # prefix-cache hits (tokens)
    queue_time_mean_s: float | None  # queue time sum / count over the span
    waiting_mean: float | None  # requests waiting, mean over the scrapes
    waiting_max: float | None
    inferred_requests: int = 0
    inferred_prompt_tokens: int = 0
    inferred_cached_tokens: int = 0

    @property
    def hit_rate(self) -> float | None:
        if self.prompt_tokens and self.cached_tokens is not None:
            return self.cached_tokens / self.prompt_tokens
        return None


@dataclass(frozen=True)
class ReplicaAccount:
    """Every replica's figures, the scrapes' span and how many ok requests were attributed."""

    replicas: tuple[ReplicaFigures, ...]
    span_s: tuple[float, float] | None  # first and last scrape, run clock
    requests_ok: int  # ok request records that ended within the span
    attributed: int
    unattributed_reasons: Mapping[str, int]

    @property
    def routed_total(self) -> float | None:
        values = [r.routed for r in self.replicas if r.routed is not None]
        return sum(values) if values else None


def read_replica_lines(run_dir: Path | None) -> list[dict[str, Any]]:
    """The lines of a run folder's `replica_metrics.jsonl` ([] where there is none)."""
    if run_dir is None or not (run_dir / REPLICA_METRICS).is_file():
        return []
    return [line for line in read_jsonl(run_dir / REPLICA_METRICS).objects
            if isinstance(line, dict) and isinstance(line.get("t_s"), int | float)
            and isinstance(line.get("replica"), str)]


def _series(lines: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    return [float(x[name]) for x in lines
            if isinstance(x.get(name), int | float) and not isinstance(x.get(name), bool)]


def _delta(lines: Sequence[Mapping[str, Any]], name: str) -> float | None:
    return counter_delta(_series(lines, name))


def replica_account(lines: Sequence[Mapping[str, Any]],
                    requests: Iterable[RequestRecord]) -> ReplicaAccount | None:
    """Per-replica figures from the replica lines (run clock) and the run's request records;
    None when there are no replica lines (a run on one server)."""
    by_replica: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in sorted(lines, key=lambda x: float(x["t_s"])):
        by_replica[str(line["replica"])].append(line)
    if not by_replica:
        return None
    times = [float(x["t_s"]) for x in lines]
    span = (min(times), max(times))
    inside = [r for r in requests if r.ok and r.end_s is not None
              and span[0] <= r.end_s <= span[1]]
    found = infer_replicas([r.to_json() for r in inside], [dict(x) for x in lines])
    by_id = {r.request_id: r for r in inside}
    own: dict[str, list[RequestRecord]] = defaultdict(list)
    reasons: dict[str, int] = defaultdict(int)
    for rid, attribution in found.items():
        if attribution.replica is None:
            reasons[attribution.how.split(":")[0]] += 1
        else:
            own[attribution.replica].append(by_id[rid])
    figures = []
    for replica, series in by_replica.items():
        ok = [x for x in series if "error" not in x]
        waiting = _series(ok, "num_requests_waiting")
        queue_sum, queue_count = _delta(ok, "queue_time_sum_s"), _delta(ok, "queue_time_count")
        mine = own.get(replica, [])
        figures.append(ReplicaFigures(
            replica=replica, samples=len(ok), failed_scrapes=len(series) - len(ok),
            routed=_delta(ok, "routed_requests"), finished=_delta(ok, "requests_finished"),
            prompt_tokens=_delta(ok, "prefix_cache_queries"),
            cached_tokens=_delta(ok, "prefix_cache_hits"),
            queue_time_mean_s=(queue_sum / queue_count if queue_sum is not None
                               and queue_count else None),
            waiting_mean=sum(waiting) / len(waiting) if waiting else None,
            waiting_max=max(waiting) if waiting else None,
            inferred_requests=len(mine),
            inferred_prompt_tokens=sum(r.prompt_tokens or 0 for r in mine),
            inferred_cached_tokens=sum(r.cached_tokens or 0 for r in mine)))
    return ReplicaAccount(replicas=tuple(figures), span_s=span, requests_ok=len(inside),
                          attributed=sum(len(v) for v in own.values()),
                          unattributed_reasons=dict(reasons))


def request_replicas(records: RunRecords) -> dict[str, str | None] | None:
    """request id -> the replica that served it (None: not known) for a run made through a
    router, from the replicas' counters (`infer_replicas`); None for a run on one server (no
    replica lines)."""
    lines = read_replica_lines(records.path)
    if not lines:
        return None
    found = infer_replicas([r.to_json() for r in records.requests if r.ok],
                           [dict(x) for x in lines])
    return {rid: a.replica for rid, a in found.items()}


def run_replica_account(records: RunRecords) -> ReplicaAccount | None:
    """`replica_account` of a run folder as read."""
    return replica_account(read_replica_lines(records.path), records.requests)


@dataclass(frozen=True)
class ContinuationCache:
    """The prefix-cache hit rate of one arm's continuation requests in one regime: the first
    postfork request of each attempt (where a rewrite breaks the cached prefix) apart from the
    later ones (whose hits depend on the router sending the agent back to the replica that
    holds its prefix), and all of them."""

    regime: str
    arm: str
    first: CacheRate
    later: CacheRate
    all: CacheRate


def _rate(regime: str, arm: str, rows: Sequence[RequestRecord]) -> CacheRate:
    usable = [r for r in rows if r.prompt_tokens is not None and r.cached_tokens is not None]
    return CacheRate(regime=regime, source=arm, n_requests=len(usable),
                     prompt_tokens=sum(r.prompt_tokens or 0 for r in usable),
                     cached_tokens=sum(r.cached_tokens or 0 for r in usable))


def continuation_cache(requests: Iterable[RequestRecord],
                       arms: Sequence[str]) -> tuple[ContinuationCache, ...]:
    """Per regime and arm, the hit rate (sum cached / sum prompt tokens) of the arm's own ok
    requests (source = the arm: no compressor, background or probe request). An attempt's
    requests are those of one session in one block (and pass); the first one sent is the
    fork's."""
    attempts: dict[tuple[str, str, int | None, str, object], list[RequestRecord]] = (
        defaultdict(list))
    for r in requests:
        if r.ok and r.source in arms:
            key = (r.regime, r.source, r.block, r.session_id or str(r.labels.get("attempt")),
                   r.labels.get("block_pass"))
            attempts[key].append(r)
    first: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    later: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for (regime, arm, *_), rows in attempts.items():
        ordered = sorted(rows, key=lambda r: r.sent_s)
        first[(regime, arm)].append(ordered[0])
        later[(regime, arm)].extend(ordered[1:])
    keys = sorted(first, key=lambda k: (regime_sort_key(k[0]), arm_sort_key(k[1])))
    return tuple(ContinuationCache(
        regime=regime, arm=arm, first=_rate(regime, arm, first[(regime, arm)]),
        later=_rate(regime, arm, later[(regime, arm)]),
        all=_rate(regime, arm, first[(regime, arm)] + later[(regime, arm)]))
        for regime, arm in keys)
