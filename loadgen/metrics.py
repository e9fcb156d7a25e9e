"""The server's /metrics, scraped about every second into `metrics.jsonl` (schema 1).

One line per scrape: `t_s` (time.monotonic minus `origin_s`, stamped when the scrape returned),
`num_requests_running`, `num_requests_waiting`, `kv_cache_usage` (0-1), the cumulative counters
`prefix_cache_hits`, `prefix_cache_queries` (tokens), `num_preemptions` and `generation_tokens`
(what the watchdog reads as "the server still streams"), and the queue-time
histogram's `queue_time_sum_s` / `queue_time_count`. Values are summed over label sets (model
names, engines); a metric the server does not export is null. A failed scrape (server gone,
restarting, refusing) writes a line with `t_s` and `error` only, and sampling goes on: the gap
stays visible in the file. Parsing is prometheus_client's text parser.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from compaction_bench.common.files import JsonlWriter
from compaction_bench.common.net import server_url

# field -> (metric family names, newest first; sample suffix)
FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "num_requests_running": (("vllm:num_requests_running",), ""),
    "num_requests_waiting": (("vllm:num_requests_waiting",), ""),
    "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), ""),
    "prefix_cache_hits": (("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), "_total"),
    "prefix_cache_queries": (("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
                             "_total"),
    "num_preemptions": (("vllm:num_preemptions",), "_total"),
    "generation_tokens": (("vllm:generation_tokens",), "_total"),
    "queue_time_sum_s": (("vllm:request_queue_time_seconds",), "_sum"),
    "queue_time_count": (("vllm:request_queue_time_seconds",), "_count"),
}


def parse_metrics(text: str) -> dict[str, float | None]:
    """The fields above from a Prometheus text exposition (summed over label sets)."""
    # keyed by sample name, so exports with and without `# TYPE` lines read the same
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    out: dict[str, float | None] = {}
    for name, (families, suffix) in FIELDS.items():
        out[name] = next((sums[f + suffix] for f in families if f + suffix in sums), None)
    return out


class MetricsSampler:
    """A daemon thread scraping `<server_url>/metrics` every `interval_s` into `path`.

    `with MetricsSampler(url, path, origin=run_start): ...` (`url` with or without /v1);
    `stop()` is idempotent and returns after the thread's last write. `latest` holds the most
    recent good sample (for the bench's progress line).
    """

    def __init__(self, url: str, path: str | Path, *, interval_s: float = 1.0,
                 origin: float = 0.0, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = server_url(url) + "/metrics"
        self.writer = JsonlWriter(path)
        self.interval_s = interval_s
        self.origin_s = origin
        self.clock = clock
        self.latest: dict[str, Any] | None = None
        self.samples = 0
        self.failures = 0
        self._client = httpx.Client(timeout=timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)

    def start(self) -> MetricsSampler:
        self._thread.start()
        return self

    def sample_once(self) -> dict[str, Any]:
        """Scrape once and write the line (never raises for a failed scrape)."""
        try:
            response = self._client.get(self.url)
            response.raise_for_status()
            values = parse_metrics(response.text)
            record: dict[str, Any] = {"t_s": self.clock() - self.origin_s, **values}
            self.latest = record
            self.samples += 1
        except (httpx.HTTPError, ValueError) as exc:
            record = {"t_s": self.clock() - self.origin_s,
                      "error": f"{type(exc).__name__} scraping {self.url}: {exc}"}
            self.failures += 1
        self.writer.write(record)
        return record

    def _run(self) -> None:
        next_due = self.clock()
        while not self._stop.is_set():
            self.sample_once()
            next_due += self.interval_s
            # on a fixed grid; after a slow scrape skip ahead instead of bursting
            next_due = max(next_due, self.clock())
            self._stop.wait(max(0.0, next_due - self.clock()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._client.close()
        self.writer.close()

    def __enter__(self) -> MetricsSampler:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
