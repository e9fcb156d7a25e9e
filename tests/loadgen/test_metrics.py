"""The /metrics sampler: parsing, a dead server, the fake server and the real vLLM server."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from compaction_bench.common.files import SCHEMA, read_jsonl
from compaction_bench.loadgen.fakeprocess import FakeProcess
from compaction_bench.loadgen.metrics import MetricsSampler, parse_metrics
from compaction_bench.serve.launcher import Server

TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="target"} 3.0
vllm:num_requests_running{engine="1",model_name="target"} 1.0
vllm:num_requests_waiting{engine="0",model_name="target"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="target"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="target"} 2884.0
vllm:prefix_cache_hits_total{engine="0",model_name="target"} 1664.0
vllm:num_preemptions_total{engine="0",model_name="target"} 2.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="target"} 3.5
vllm:request_queue_time_seconds_count{engine="0",model_name="target"} 10.0
vllm:generation_tokens_total{engine="0",model_name="target"} 700.0
vllm:generation_tokens_total{engine="1",model_name="target"} 77.0
"""


def test_parse_sums_label_sets() -> None:
    values = parse_metrics(TEXT)
    assert values == {"num_requests_running": 4.0, "num_requests_waiting": 5.0,
                      "kv_cache_usage": 0.25, "prefix_cache_hits": 1664.0,
                      "prefix_cache_queries": 2884.0, "num_preemptions": 2.0,
                      "queue_time_sum_s": 3.5, "queue_time_count": 10.0,
                      "generation_tokens": 777.0}
    assert parse_metrics("")["num_requests_waiting"] is None


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
