"""The /metrics sampler: a dead server, the fake server and the real vLLM server (parsing:
tests/serve/test_endpoints.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from compaction_bench.common.files import SCHEMA, read_jsonl
from compaction_bench.loadgen.fakeprocess import FakeProcess
from compaction_bench.loadgen.metrics import MetricsSampler
from compaction_bench.serve.launcher import Server


def test_dead_server_records_the_gap_and_stops(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "metrics.jsonl"
    sampler = MetricsSampler(f"http://127.0.0.1:{port}/v1", path, interval_s=0.05,
                             origin=time.monotonic()).start()
    time.sleep(0.3)
    sampler.stop()
    rows = read_jsonl(path).objects
    assert len(rows) >= 2 and sampler.failures == len(rows)
    assert all(r["schema"] == SCHEMA and "error" in r and r["t_s"] >= 0 for r in rows)
    assert "/metrics" in rows[0]["error"]


@pytest.mark.e2e
def test_fake_server_samples(fake: FakeProcess, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsSampler(fake.server_url, path, interval_s=0.1) as sampler:
        time.sleep(0.35)
    rows = read_jsonl(path).objects
    assert sampler.samples >= 2 and len(rows) == sampler.samples
    assert rows[0]["num_requests_running"] == 0.0 and "prefix_cache_queries" in rows[0]


@pytest.mark.integration
def test_real_server_metrics(cpu_server: Server, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsSampler(cpu_server.api_url, path, interval_s=0.2):
        time.sleep(0.5)
    rows = read_jsonl(path).objects
    assert rows and "error" not in rows[0]
    for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage",
                "prefix_cache_hits", "prefix_cache_queries", "num_preemptions",
                "queue_time_sum_s", "queue_time_count"):
        assert rows[0][key] is not None, key
