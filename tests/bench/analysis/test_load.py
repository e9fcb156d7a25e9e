"""A block's load figures and verdict, from hand-made records whose truth is known."""

from __future__ import annotations

from compaction_bench.bench.analysis.load import block_load
from compaction_bench.bench.runfolder import LoadSample, MetricSample
from compaction_bench.transport.request import RequestRecord


def background(i: int, sent: float, end: float, status: str = "ok",
               http: int | None = 200) -> RequestRecord:
    return RequestRecord(request_id=f"bg-{i}", sent_s=sent, end_s=end, status=status,
                         source="background", regime="overloaded", block=1, http_status=http,
                         error=None if status == "ok" else "HTTP 500")


def test_concurrency_waiting_and_a_valid_overloaded_block() -> None:
    requests = [background(i, 0.0, 10.0) for i in range(4)] + [background(9, 5.0, 15.0)]
    metrics = [MetricSample(t_s=t, num_requests_waiting=w) for t, w in
               ((1.0, 0.0), (4.0, 2.0), (7.0, 3.0), (9.0, 1.0))]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, metrics,
                      [LoadSample(t_s=2.0, running=True)])
    assert load.valid, load.reasons
    assert load.achieved_concurrency == 4.5  # 4 requests all along + 1 for half the block
    assert load.waiting_share == 0.75 and load.max_waiting == 3.0
    assert (load.background_requests, load.background_ok) == (5, 4)


def test_every_reason_a_block_is_invalid() -> None:
    errors = [background(i, 0.0, 2.0, "error", 500) for i in range(3)] + [background(5, 0, 3)]
    unauthorized = [background(7, 1.0, 1.5, "error", 401)]
    load = block_load("overloaded", 8, 0.0, 10.0, errors + unauthorized,
                      [MetricSample(t_s=5.0, num_requests_waiting=0.0)],
                      [LoadSample(t_s=4.0, running=False)])
    text = " | ".join(load.reasons)
    assert "not running at t=4.0 s" in text
    assert "1 background requests were refused as unauthorized" in text
    assert "4 of 5 background requests that ended in the block failed" in text
    assert "never queued" in text
    silent = block_load("shared", 2, 0.0, 10.0, [], [], [])
    assert silent.reasons == ("no background load was recorded during the block",)
    dedicated = block_load("dedicated", 0, 0.0, 10.0, [], [], [])
    assert dedicated.valid and dedicated.achieved_concurrency == 0.0
