"""The server's /metrics, scraped about every second into `metrics.jsonl` (schema 1).

One line per scrape: `t_s` (time.monotonic minus `origin_s`, stamped when the scrape returned),
`num_requests_running`, `num_requests_waiting`, `kv_cache_usage` (0-1), the cumulative counters
`prefix_cache_hits`, `prefix_cache_queries` (tokens), `num_preemptions` and `generation_tokens`
(what the watchdog reads as "the server still streams"), and the queue-time
histogram's `queue_time_sum_s` / `queue_time_count`. Values are summed over label sets (model
names, engines); a metric the server does not export is null. A failed scrape (server gone,
restarting, refusing) writes a line with `t_s` and `error` only, and sampling goes on: the gap
stays visible in the file. Scraping and parsing are the server endpoints' client's
(`serve.endpoints`: prometheus_client's text parser, the fields of `FIELDS`).

Through a router, whose own /metrics is one replica's, the sampler is given the replicas and a
line is their sum (counters, running and waiting requests) with `kv_cache_usage` their mean, so
the file stays the whole served capacity's series; a replica that fails its scrape makes the
line an error line. Each replica's own series is `replica_metrics.jsonl`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.periodic import Periodic
from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints


class MetricsSampler:
    """A daemon thread scraping `<server_url>/metrics` every `interval_s` into `path`.

    `with MetricsSampler(url, path, origin=run_start): ...` (`url` with or without /v1);
    `stop()` is idempotent and returns after the thread's last write. `latest` holds the most
    recent good sample (for the bench's progress line).
    """

    def __init__(self, url: str, path: str | Path, *, interval_s: float = 1.0,
                 origin: float = 0.0, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 replicas: Sequence[str] = ()) -> None:
        self.server = ServerEndpoints(url, timeout_s=timeout_s)
        self.replicas = [ServerEndpoints(u, timeout_s=timeout_s) for u in replicas]
        self.writer = JsonlWriter(path)
        self.interval_s = interval_s
        self.origin_s = origin
        self.clock = clock
        self.latest: dict[str, Any] | None = None
        self.samples = 0
        self.failures = 0
        self._beat = Periodic(self.sample_once, interval_s=interval_s, clock=clock,
                              name="metrics-sampler")

    def start(self) -> MetricsSampler:
        self._beat.start()
        return self

    def sample_once(self) -> dict[str, Any]:
        """Scrape once and write the line (never raises for a failed scrape)."""
        try:
            values = (self.server.metrics() if not self.replicas else
                      combined([r.metrics() for r in self.replicas]))
            record: dict[str, Any] = {"t_s": self.clock() - self.origin_s, **values}
            self.latest = record
            self.samples += 1
        except EndpointError as exc:
            record = {"t_s": self.clock() - self.origin_s, "error": str(exc)}
            self.failures += 1
        self.writer.write(record)
        return record

    def stop(self) -> None:
        self._beat.stop()
        self.server.close()
        for replica in self.replicas:
            replica.close()
        self.writer.close()

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def combined(parts: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Several replicas' fields as one server's: sums, `kv_cache_usage` the mean; a field any
    replica lacks is None."""
    out: dict[str, float | None] = {}
    for key in parts[0] if parts else {}:
        values = [p.get(key) for p in parts]
        if any(v is None for v in values):
            out[key] = None
            continue
        total = sum(float(v) for v in values if v is not None)
        out[key] = total / len(values) if key == "kv_cache_usage" else total
    return out
