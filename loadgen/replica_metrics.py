"""Every replica's /metrics behind a router, scraped about every second into
`replica_metrics.jsonl`, and which replica served a request, inferred from them.

A router's own `/metrics` is one replica's (vllm-router 0.1.17 proxies it to a worker), so the
run's `metrics.jsonl` cannot speak for several replicas; this file does, one line per replica
per scrape: the fields of `metrics.jsonl` (serve.endpoints.FIELDS, `requests_finished` among
them) plus `replica` (the replica's server URL) and, where the router's own Prometheus port is
known, `routed_requests` (the router's cumulative count of HTTP requests it sent to that
replica: /v1/models, /tokenize and /health through it count too, not only chat requests).
A failed scrape writes `t_s`, `replica` and `error`. They are separate from `metrics.jsonl`
so that its counters stay one server's series.

No response says which replica answered (vllm-router 0.1.17 adds no such header), so
`infer_replicas` attributes a request to a replica from the counters: to the one replica whose
`requests_finished` rose in the scrapes around the request's end, else to none (ambiguous: two
replicas finished requests then). Exact for requests that end alone; under load most are
ambiguous, and per-replica figures then come from the counters' deltas, not from requests.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.periodic import Periodic
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints

REPLICA_METRICS = "replica_metrics.jsonl"


@dataclass(frozen=True)
class ReplicaTargets:
    """The replicas behind a router (server URLs) and the router's own Prometheus URL."""

    urls: tuple[str, ...]
    router_metrics_url: str | None = None


class ReplicaSampler:
    """A daemon thread scraping every replica's `/metrics` (and the router's counters) every
    `interval_s` into `path`; `with ReplicaSampler(targets, path, origin=run_start): ...`."""

    def __init__(self, targets: ReplicaTargets, path: str | Path, *, interval_s: float = 1.0,
                 origin: float = 0.0, timeout_s: float = 5.0, clock: Clock = monotonic,
                 routed: Callable[[str], dict[str, float]] | None = None) -> None:
        from compaction_bench.serve.router import routed_counts

        self.targets = targets
        self.servers = [ServerEndpoints(u, timeout_s=timeout_s) for u in targets.urls]
        self.writer = JsonlWriter(path)
        self.interval_s = interval_s
        self.origin_s = origin
        self.clock = clock
        self.routed = routed or routed_counts
        self.samples = 0
        self._stopped = False
        self._beat = Periodic(self.sample_once, interval_s=interval_s, clock=clock,
                              name="replica-sampler")

    def sample_once(self) -> list[dict[str, Any]]:
        """One scrape of the router's counters and every replica; the lines written."""
        routed: dict[str, float] | None = None
        if self.targets.router_metrics_url:
            try:
                routed = self.routed(self.targets.router_metrics_url)
            except (httpx.HTTPError, ValueError):  # an extra: the replicas' lines go on
                routed = None
        lines = []
        for url, server in zip(self.targets.urls, self.servers, strict=True):
            try:
                values: dict[str, Any] = dict(server.metrics())
                if routed is not None:
                    values["routed_requests"] = routed.get(url.rstrip("/"), 0.0)
                record = {"t_s": self.clock() - self.origin_s, "replica": url, **values}
            except EndpointError as exc:
                record = {"t_s": self.clock() - self.origin_s, "replica": url,
                          "error": str(exc)}
            self.writer.write(record)
            lines.append(record)
        self.samples += 1
        return lines

    def __enter__(self) -> ReplicaSampler:
        self._beat.start()
        return self

    def stop(self) -> None:
        """Stop sampling (idempotent) after one last scrape, so the counters' deltas also
        cover the requests that ended since the previous one; returns after it is written."""
        if self._stopped:
            return
        self._stopped = True
        self._beat.stop()
        if self.samples:
            self.sample_once()
        for server in self.servers:
            server.close()
        self.writer.close()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@dataclass(frozen=True)
class Attribution:
    """Which replica served a request (None: not known) and how that was decided."""

    replica: str | None
    how: str


def infer_replicas(requests: Iterable[dict[str, Any]], lines: Sequence[dict[str, Any]], *,
                   slack_s: float = 0.25, after_s: float = 0.1) -> dict[str, Attribution]:
    """request_id -> `Attribution`, for the ok requests (`requests.jsonl` lines, run clock)
    given the replica lines (same clock). A request goes to a replica when that replica is the
    only one whose `requests_finished` rose in a scrape interval overlapping [end - slack_s,
    end + after_s] (vLLM counts a request a moment before its last byte arrives; a server may
    also count it a moment after, and a scrape in that moment sees no rise yet: a CI run's
    loaded machine left a request with none), and no more requests are given to one interval
    than the counter rose by."""
    series: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for line in sorted(lines, key=lambda x: float(x["t_s"])):
        value = line.get("requests_finished")
        if line.get("replica") and isinstance(value, int | float):
            times, counts = series[str(line["replica"])]
            times.append(float(line["t_s"]))
            counts.append(float(value))
    out: dict[str, Attribution] = {}
    claims: dict[tuple[str, int], list[str]] = defaultdict(list)
    for record in requests:
        end = record.get("end_s")
        if record.get("status") != "ok" or not isinstance(end, int | float):
            continue
        rose: list[tuple[str, int]] = []
        for replica, (times, counts) in series.items():
            first = max(1, bisect.bisect_left(times, end - slack_s))
            last = bisect.bisect_left(times, end + after_s)  # the first scrape past it
            rose += [(replica, k) for k in range(first, min(last, len(times) - 1) + 1)
                     if counts[k] > counts[k - 1]]
        rid = str(record["request_id"])
        if len({r for r, _ in rose}) == 1:
            claims[rose[-1]].append(rid)
            out[rid] = Attribution(rose[-1][0], "inferred: the only replica whose finished "
                                   "count rose as it ended")
        else:
            why = "no replica's finished count rose as it ended" if not rose else (
                f"ambiguous: {len({r for r, _ in rose})} replicas finished requests as it ended")
            out[rid] = Attribution(None, why)
    for (replica, k), rids in claims.items():
        counts = series[replica][1]
        if len(rids) > counts[k] - counts[k - 1]:
            for rid in rids:
                out[rid] = Attribution(None, "ambiguous: more requests ended than the replica "
                                       "finished in that interval")
    return out
