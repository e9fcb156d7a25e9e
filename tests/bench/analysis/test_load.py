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
    assert load.verdict == "verified"  # 3 of 4 samples queued: at least half
    assert load.basis == ("requests waited in 75% of the 4 /metrics samples while the arms ran "
                          "(at least 50%)")
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
    assert "requests waited in 0% of the 1 /metrics samples while the arms ran" in text
    silent = block_load("shared", 2, 0.0, 10.0, [], [], [])
    assert silent.reasons == ("no background load was recorded during the block",)
    dedicated = block_load("dedicated", 0, 0.0, 10.0, [], [], [])
    assert dedicated.valid and dedicated.achieved_concurrency == 0.0
    assert dedicated.verdict == "unverified"  # no counter sample: nothing checked
    assert "'no other traffic' is not checked" in dedicated.unverified[0]


def test_no_queue_sample_is_unverified_never_verified() -> None:
    """Issue 22: an overloaded block with no vllm:num_requests_waiting sample (another server,
    a key-protected /metrics, failed scrapes) counted as verified."""
    requests = [background(i, 0.0, 10.0) for i in range(4)]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, [],
                      [LoadSample(t_s=2.0, running=True)])
    assert load.valid and load.verdict == "unverified"
    assert "no vllm:num_requests_waiting sample while the arms ran" in load.unverified[0]
    assert load.to_json()["verdict"] == "unverified"


def test_one_queued_sample_before_the_arms_does_not_verify_the_block() -> None:
    """Issue 22: one 1-Hz sample with a queued request anywhere from block start (before setup
    and replay) validated the block. The verdict reads the samples while the arms ran."""
    requests = [background(i, 0.0, 10.0) for i in range(4)]
    metrics = [MetricSample(t_s=t, num_requests_waiting=w) for t, w in
               ((0.5, 5.0), (4.0, 0.0), (6.0, 0.0), (8.0, 1.0), (9.0, 0.0))]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, metrics,
                      [LoadSample(t_s=2.0, running=True)], arms_from=3.0)
    assert load.verdict == "failed"
    assert "requests waited in 25% of the 4 /metrics samples while the arms ran" in (
        load.reasons[0])


def test_a_shared_block_is_verified_below_capacity_only() -> None:
    requests = [background(i, 0.0, 10.0) for i in range(2)]
    calm = [MetricSample(t_s=t, num_requests_waiting=0.0) for t in (2.0, 5.0, 8.0)]
    busy = [*calm, MetricSample(t_s=9.0, num_requests_waiting=2.0)]
    running = [LoadSample(t_s=2.0, running=True)]
    below = block_load("shared", 2, 0.0, 10.0, requests, calm, running)
    assert below.verdict == "verified"
    assert below.basis == "no request waited in the 3 /metrics samples while the arms ran"
    queued = block_load("shared", 2, 0.0, 10.0, requests, busy, running)
    assert queued.verdict == "unverified" and "at capacity at times" in queued.unverified[0]


def arm(i: int, sent: float, end: float, source: str = "clean") -> RequestRecord:
    return RequestRecord(request_id=f"{source}-{i}", sent_s=sent, end_s=end, status="ok",
                         source=source, regime="dedicated", block=1)


def finished(*points: tuple[float, float]) -> list[MetricSample]:
    return [MetricSample(t_s=t, num_requests_waiting=0.0, requests_finished=n)
            for t, n in points]


def test_a_dedicated_block_that_served_only_its_own_requests_is_verified() -> None:
    """Issue 22: a dedicated block was always unverified ('no other traffic' unchecked). The
    server's finished-request counter rose by 4 while the arms ran; the run's own records end
    4 requests there (one a compressor call, one ending a moment after the last scrape: the
    server counts it before its client sees the end)."""
    own = [arm(0, 3.0, 4.0), arm(1, 4.0, 6.0, "self"), arm(2, 4.5, 7.0, "self/compressor"),
           arm(3, 7.0, 9.4)]
    setup = [arm(9, 0.5, 1.0)]  # before the arms' release: the counter's rise excludes it
    metrics = finished((1.5, 10.0), (3.2, 10.0), (5.0, 11.0), (9.3, 14.0))
    load = block_load("dedicated", 0, 0.0, 10.0, setup + own, metrics, [], arms_from=3.0)
    assert load.verdict == "verified", (load.reasons, load.unverified)
    assert (load.server_finished, load.own_finished, load.foreign_requests) == (4.0, 4, 0)
    # the report says what `verified` rests on
    assert load.basis == ("the server finished 4 requests between the /metrics samples while "
                          "the arms ran, no more than the run's own records end there (4, "
                          "within 0.5 s)")
    assert load.to_json()["foreign_requests"] == 0


def test_a_dedicated_block_with_other_traffic_fails() -> None:
    """Issue 22: requests another client sent during a dedicated block went unnoticed."""
    own = [arm(0, 3.0, 4.0), arm(1, 4.0, 8.0)]
    metrics = finished((3.2, 10.0), (6.0, 12.0), (9.0, 15.0))  # +5, of which 2 the run's
    load = block_load("dedicated", 0, 0.0, 10.0, own, metrics, [], arms_from=3.0)
    assert load.verdict == "failed" and not load.valid
    (reason,) = load.reasons
    assert reason.startswith("3 requests not ours (at least): the server finished 5 "
                             "requests between t=3.2 s and t=9.0 s")
    assert load.foreign_requests == 3 and load.own_finished == 2


def test_a_dedicated_block_without_a_usable_counter_is_unverified_never_verified() -> None:
    own = [arm(0, 3.0, 4.0)]
    one = block_load("dedicated", 0, 0.0, 10.0, own, finished((5.0, 3.0)), [], arms_from=3.0)
    assert one.verdict == "unverified" and one.unverified[0].startswith(
        "1 vllm:request_success_total sample(s) while the arms ran")
    restarted = block_load("dedicated", 0, 0.0, 10.0, own,
                           finished((3.5, 40.0), (5.0, 0.0), (7.0, 1.0)), [], arms_from=3.0)
    assert restarted.verdict == "unverified" and "went down at t=5.0 s" in (
        restarted.unverified[0])
    assert restarted.foreign_requests is None
    # samples without the counter (an older metrics.jsonl, another server) count as none
    older = [MetricSample(t_s=t, num_requests_waiting=0.0) for t in (4.0, 6.0)]
    assert block_load("dedicated", 0, 0.0, 10.0, own, older, [],
                      arms_from=3.0).verdict == "unverified"


def test_a_counter_that_misses_the_runs_own_requests_is_unverified() -> None:
    """A counter that did not rise with the run's own answered requests is not this server's
    (another server's /metrics): 'no other traffic' cannot be read from it, so not verified."""
    own = [arm(i, 3.0 + i, 4.0 + i) for i in range(4)]  # ends at 4, 5, 6, 7 s
    load = block_load("dedicated", 0, 0.0, 10.0, own, finished((3.2, 7.0), (8.5, 8.0)), [],
                      arms_from=3.0)
    assert load.verdict == "unverified" and "fewer than the 4 answered requests" in (
        load.unverified[0])
