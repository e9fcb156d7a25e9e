"""The replica sampler's last scrape: on stop it scrapes once more, so the counters' deltas cover
the requests that ended after the previous scrape (a short run would otherwise show none)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from compaction_bench.common.files import read_jsonl
from compaction_bench.loadgen.fakeserver import FakeConfig
from compaction_bench.loadgen.replica_metrics import ReplicaSampler, ReplicaTargets
from compaction_bench.transport.client import send_once


def test_stop_scrapes_once_more_so_the_last_requests_are_counted(
        fake_in_thread: Callable[[FakeConfig], AbstractContextManager[str]],
        tmp_path: Path) -> None:
    with fake_in_thread(FakeConfig(ttft_ms=1, tokens=2)) as api_url:
        server = api_url.removesuffix("/v1")
        path = tmp_path / "replica_metrics.jsonl"
        sampler = ReplicaSampler(ReplicaTargets((server,)), path, interval_s=3600.0)
        with sampler:  # one scrape at the start, the next an hour later: never, here
            deadline = time.monotonic() + 10
            while not sampler.samples and time.monotonic() < deadline:
                time.sleep(0.01)  # the first scrape comes before any request
            for i in range(3):
                got = send_once(api_url, {"model": "target", "max_tokens": 2, "messages": [
                    {"role": "user", "content": f"hi {i}"}]}, request_id=f"r{i}")
                assert got.record.ok, got.record.error
        sampler.stop()  # idempotent: no third line
        lines = read_jsonl(path).objects
    assert [line["requests_finished"] for line in lines] == [0.0, 3.0]
