"""A block's load figures and verdict, from hand-made records whose truth is known."""

from __future__ import annotations

from compaction_bench.bench.analysis.load import MIN_SAMPLES, block_load
from compaction_bench.bench.runfolder import LoadSample, MetricSample
from compaction_bench.transport.request import RequestRecord


def background(i: int, sent: float, end: float, status: str = "ok",
               http: int | None = 200) -> RequestRecord:
    return RequestRecord(request_id=f"bg-{i}", sent_s=sent, end_s=end, status=status,
                         source="background", regime="overloaded", block=1, http_status=http,
                         error=None if status == "ok" else "HTTP 500")


def test_concurrency_waiting_and_a_valid_overloaded_block() -> None:
    requests = [background(i, 0.0, 10.0) for i in range(4)] + [background(9, 5.0, 15.0)]
    # 12 scrapes (at least MIN_SAMPLES), queues of 0, 2, 3, 1 in turn
    metrics = [MetricSample(t_s=0.5 + 0.75 * k, num_requests_waiting=(0.0, 2.0, 3.0, 1.0)[k % 4])
               for k in range(12)]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, metrics,
                      [LoadSample(t_s=2.0, running=True)])
    assert load.valid, load.reasons
    assert load.verdict == "verified"  # 9 of 12 samples queued: at least half
    assert load.basis == ("requests waited in 9 of the 12 /metrics samples while the arms ran "
                          "(at least 6, 50%)")
    assert load.achieved_concurrency == 4.5  # 4 requests all along + 1 for half the block
    assert load.waiting_share == 0.75 and load.max_waiting == 3.0
    assert (load.background_requests, load.background_ok) == (5, 4)


def test_every_reason_a_block_is_invalid() -> None:
    errors = [background(i, 0.0, 2.0, "error", 500) for i in range(3)] + [background(5, 0, 3)]
    unauthorized = [background(7, 1.0, 1.5, "error", 401)]
    load = block_load("overloaded", 8, 0.0, 10.0, errors + unauthorized,
                      [MetricSample(t_s=0.5 + 0.5 * k, num_requests_waiting=0.0)
                       for k in range(10)],
                      [LoadSample(t_s=4.0, running=False)])
    text = " | ".join(load.reasons)
    assert "not running at t=4.0 s" in text
    assert "1 background requests were refused as unauthorized" in text
    assert "4 of 5 background requests that ended in the block failed" in text
    assert "requests waited in 0 of the 10 /metrics samples while the arms ran" in text
    assert "achieved background concurrency 0.95 while the arms ran, below half the 8" in text
    silent = block_load("shared", 2, 0.0, 10.0, [], [], [])
    assert silent.reasons == ("no background request ended or was in flight during the block: "
                              "its 2 users sent nothing; see the load's log in the run folder's "
                              "background/",)
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
    metrics = [MetricSample(t_s=0.5, num_requests_waiting=5.0)] + [
        MetricSample(t_s=3.5 + 0.5 * k, num_requests_waiting=1.0 if k == 9 else 0.0)
        for k in range(12)]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, metrics,
                      [LoadSample(t_s=2.0, running=True)], arms_from=3.0)
    assert load.verdict == "failed"
    assert "requests waited in 1 of the 12 /metrics samples while the arms ran" in (
        load.reasons[0])


def test_a_shared_block_is_verified_below_capacity_only() -> None:
    requests = [background(i, 0.0, 10.0) for i in range(2)]
    calm = [MetricSample(t_s=0.5 + 0.75 * k, num_requests_waiting=0.0) for k in range(12)]
    busy = [*calm, MetricSample(t_s=9.5, num_requests_waiting=2.0)]
    running = [LoadSample(t_s=2.0, running=True)]
    below = block_load("shared", 2, 0.0, 10.0, requests, calm, running)
    assert below.verdict == "verified"
    assert below.basis == "no request waited in the 12 /metrics samples while the arms ran"
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
    # a scrape every 0.5 s from 3.3 s (13 while the arms ran) of a server that counts a request
    # 0.15 s before its client sees the end and runs exactly the run's own
    metrics = [MetricSample(t_s=t, num_requests_waiting=0.0, requests_finished=10.0 + sum(
        (r.end_s or 0.0) - 0.15 <= t for r in own), num_requests_running=float(sum(
            r.sent_s <= t < (r.end_s or 0.0) - 0.15 for r in own)))
        for t in [1.5] + [3.3 + 0.5 * k for k in range(13)]]
    load = block_load("dedicated", 0, 0.0, 10.0, setup + own, metrics, [], arms_from=3.0)
    assert load.verdict == "verified", (load.reasons, load.unverified)
    assert (load.server_finished, load.own_finished, load.foreign_requests) == (4.0, 4, 0)
    # the report says what `verified` rests on
    assert load.basis == ("the server finished 4 requests while the arms ran, no more than the "
                          "run's own answered requests to this server that ended then (4, "
                          "within 0.5 s), and held no more requests than the run's own in "
                          "flight at each of the 13 /metrics samples")
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


# Issue 30: series A-I, each built to fail, each once came back `verified`. Samples every
# 0.5 s from the arms' release at 3 s to the block's end at 10 s: 15 of them.
ARMS_T = [3.0 + 0.5 * k for k in range(15)]


def queue(waiting: float | list[float], t: list[float] | None = None) -> list[MetricSample]:
    times = ARMS_T if t is None else t
    values = waiting if isinstance(waiting, list) else [waiting] * len(times)
    return [MetricSample(t_s=s, num_requests_waiting=w) for s, w in zip(times, values,
                                                                         strict=True)]


def busy_background(users: int, regime: str = "overloaded") -> list[RequestRecord]:
    """`users` background requests in flight through the whole block."""
    return [RequestRecord(request_id=f"bg-{i}", sent_s=0.0, end_s=10.0, status="ok",
                          source="background", regime=regime, block=1) for i in range(users)]


RUNNING = [LoadSample(t_s=t, running=True) for t in (1.0, 5.0, 9.0)]


def test_series_a_overloaded_without_any_background_request_fails() -> None:
    """A: load.jsonl says running, 0 background requests; the queue was the arms' own."""
    load = block_load("overloaded", 8, 0.0, 10.0, [], queue(3.0), RUNNING, arms_from=3.0)
    assert load.verdict == "failed"
    assert load.reasons[0].startswith(
        "no background request ended or was in flight during the block, though load.jsonl "
        "says the load ran")
    assert load.basis is None


def test_series_h_shared_without_any_background_request_fails() -> None:
    """H: shared, load running, 0 background requests."""
    load = block_load("shared", 2, 0.0, 10.0, [], queue(0.0), RUNNING, arms_from=3.0)
    assert load.verdict == "failed" and load.basis is None
    assert "no background request ended or was in flight" in load.reasons[0]


def test_series_b_one_parsed_sample_of_301_is_unverified() -> None:
    """B: one of 301 scrapes parsed (the others are error lines: every field null)."""
    scrapes = [MetricSample(t_s=3.0 + 0.02 * k) for k in range(300)]
    scrapes.append(MetricSample(t_s=5.0, num_requests_waiting=4.0))
    load = block_load("overloaded", 8, 0.0, 10.0, busy_background(8), scrapes, RUNNING,
                      arms_from=3.0)
    assert load.verdict == "unverified" and load.basis is None
    assert load.unverified[0].startswith(
        f"1 parsed /metrics sample(s) while the arms ran, fewer than the {MIN_SAMPLES}")
    assert load.arms_samples == 1


def test_series_c_overloaded_below_half_its_users_fails() -> None:
    """C: 64 users configured, achieved background concurrency 0.95."""
    requests = [RequestRecord(request_id="bg-0", sent_s=0.0, end_s=9.5, status="ok",
                              source="background", regime="overloaded", block=1)]
    load = block_load("overloaded", 64, 0.0, 10.0, requests, queue(5.0), RUNNING)
    assert load.achieved_concurrency == 0.95
    assert load.verdict == "failed" and load.basis is None
    assert load.reasons[0].startswith(
        "achieved background concurrency 0.95 while the arms ran, below half the 64 users "
        "configured (32)")


def test_concurrency_counts_the_loads_own_in_flight_where_records_are_not_written_yet() -> None:
    """At a block's end the bench has no record of a background request still in flight (the
    load writes it when it ends): load.jsonl's in-flight count stands in for it."""
    requests = busy_background(2)
    samples = [LoadSample(t_s=t, running=True, in_flight=8) for t in (3.0, 6.0, 9.0)]
    load = block_load("overloaded", 8, 0.0, 10.0, requests, queue(5.0), samples, arms_from=3.0)
    assert load.verdict == "verified", load.reasons
    assert load.arms_concurrency == 8.0
    short = [LoadSample(t_s=t, running=True, in_flight=2) for t in (3.0, 6.0, 9.0)]
    assert block_load("overloaded", 8, 0.0, 10.0, requests, queue(5.0), short,
                      arms_from=3.0).verdict == "failed"


def test_series_i_overloaded_with_no_users_prints_no_basis() -> None:
    """I: users = 0 in overloaded read 'requests waited in 0% ... (at least 50%)'."""
    load = block_load("overloaded", 0, 0.0, 10.0, [], queue(0.0), [], arms_from=3.0)
    assert load.verdict == "unverified" and load.basis is None
    assert load.unverified[0].startswith("no background users configured (users = 0)")


def test_the_queued_share_is_printed_as_a_count_that_agrees_with_the_rule() -> None:
    """150 of 301 was printed '50% ... fewer than 50%'."""
    t = [3.0 + 7.0 * k / 300 for k in range(301)]
    load = block_load("overloaded", 8, 0.0, 10.0, busy_background(8),
                      queue([1.0] * 150 + [0.0] * 151, t), RUNNING, arms_from=3.0)
    assert load.verdict == "failed"
    assert load.reasons[0].startswith(
        "requests waited in 150 of the 301 /metrics samples while the arms ran, fewer than "
        "the 151 (50%)")
    passed = block_load("overloaded", 8, 0.0, 10.0, busy_background(8),
                        queue([1.0] * 151 + [0.0] * 150, t), RUNNING, arms_from=3.0)
    assert passed.basis == ("requests waited in 151 of the 301 /metrics samples while the arms "
                            "ran (at least 151, 50%)")


def test_quiet_controls_of_the_queue_regimes_are_verified() -> None:
    overloaded = block_load("overloaded", 8, 0.0, 10.0, busy_background(8), queue(4.0),
                            RUNNING, arms_from=3.0)
    assert overloaded.verdict == "verified", overloaded.reasons + overloaded.unverified
    assert overloaded.basis == ("requests waited in 15 of the 15 /metrics samples while the "
                                "arms ran (at least 8, 50%)")
    shared = block_load("shared", 2, 0.0, 10.0, busy_background(2, "shared"), queue(0.0),
                        RUNNING, arms_from=3.0)
    assert shared.verdict == "verified", shared.reasons + shared.unverified
    assert shared.basis == "no request waited in the 15 /metrics samples while the arms ran"


def replica_lines(waiting: dict[str, float], ends: dict[str, list[float]]
                  ) -> list[dict[str, object]]:
    """Each replica's scrapes (every 0.5 s) with its queue, its finished counter rising by one
    just after each of its `ends`."""
    lines: list[dict[str, object]] = []
    for replica, w in waiting.items():
        for t in ARMS_T:
            done = sum(e <= t for e in ends.get(replica, []))
            lines.append({"t_s": t, "replica": replica, "num_requests_waiting": w,
                          "requests_finished": float(done)})
    return lines


def test_series_d_behind_a_router_the_arms_replica_is_judged_by_its_own_samples() -> None:
    """D: metrics.jsonl sums the replicas. Replica A queued 5, replica B was idle, and the
    arms, which went to B, were judged overloaded on the sum."""
    arms = [arm(i, 3.0 + i, 3.2 + i * 1.5) for i in range(4)]  # end alone: 3.2, 4.7, 6.2, 7.7
    lines = replica_lines({"http://a:8000": 5.0, "http://b:8000": 0.0},
                          {"http://b:8000": [r.end_s or 0.0 for r in arms]})
    load = block_load("overloaded", 8, 0.0, 10.0, busy_background(8) + arms, queue(5.0),
                      RUNNING, arms_from=3.0, replicas=lines)
    assert load.verdict == "failed" and load.basis is None
    assert load.reasons[0].startswith(
        "requests waited in 0 of the 15 /metrics samples of replica http://b:8000 while the arms "
        "ran")
    assert "the arms' requests went to http://b:8000" in load.reasons[0]
    # quiet control: the arms went to A, the replica that queued
    on_a = replica_lines({"http://a:8000": 5.0, "http://b:8000": 0.0},
                         {"http://a:8000": [r.end_s or 0.0 for r in arms]})
    verified = block_load("overloaded", 8, 0.0, 10.0, busy_background(8) + arms, queue(5.0),
                          RUNNING, arms_from=3.0, replicas=on_a)
    assert verified.verdict == "verified", verified.reasons + verified.unverified
    assert verified.basis == ("requests waited in 15 of the 15 /metrics samples of replica "
                              "http://a:8000 while the arms ran (at least 8, 50%)")
    # the arms' replica not known (their requests ended together on both): not judged on sums
    both = replica_lines({"http://a:8000": 5.0, "http://b:8000": 0.0},
                         {"http://a:8000": [6.2], "http://b:8000": [6.2]})
    together = [arm(0, 3.0, 6.2)]
    unknown = block_load("overloaded", 8, 0.0, 10.0, busy_background(8) + together,
                         queue(5.0), RUNNING, arms_from=3.0, replicas=both)
    assert unknown.verdict == "unverified" and unknown.basis is None
    assert unknown.unverified[0].startswith("behind a router: 1 of the arms' 1 answered "
                                            "requests could not be attributed to a replica")
    # every replica queued: the arms' replica does not matter
    full = block_load("overloaded", 8, 0.0, 10.0, busy_background(8) + together, queue(5.0),
                      RUNNING, arms_from=3.0,
                      replicas=replica_lines({"http://a:8000": 5.0, "http://b:8000": 2.0},
                                             {"http://a:8000": [6.2], "http://b:8000": [6.2]}))
    assert full.verdict == "verified" and full.basis is not None
    assert full.basis.startswith("on every replica: requests waited in 15 of the 15")


def counted(points: list[tuple[float, float, float]]) -> list[MetricSample]:
    """(t, finished counter, requests running) scrapes of a dedicated block's server."""
    return [MetricSample(t_s=t, num_requests_waiting=0.0, num_requests_running=run,
                         requests_finished=n) for t, n, run in points]


def own_series() -> tuple[list[RequestRecord], list[MetricSample]]:
    """The run's own requests one after another from 3 s (each 1 s, one in flight at a time:
    ends 4, 5, ..., 9 s) and a server that saw exactly them: a quiet dedicated block."""
    own = [arm(i, 3.0 + i, 4.0 + i) for i in range(6)]
    metrics = counted([(t, 100.0 + sum(r.end_s is not None and r.end_s <= t for r in own),
                        1.0 if t < 9.0 else 0.0) for t in [3.25 + 0.5 * k for k in range(13)]])
    return own, metrics


def test_a_quiet_dedicated_block_is_verified_on_both_checks() -> None:
    own, metrics = own_series()
    load = block_load("dedicated", 0, 0.0, 10.0, own, metrics, [], arms_from=3.0)
    assert load.verdict == "verified", load.reasons + load.unverified
    assert (load.server_finished, load.own_finished, load.foreign_requests) == (6.0, 6, 0)
    assert load.foreign_running == 0
    assert load.basis == (
        "the server finished 6 requests while the arms ran, no more than the run's own answered "
        "requests to this server that ended then (6, within 0.5 s), and held no more requests "
        "than the run's own in flight at each of the 13 /metrics samples")


def test_series_e_a_foreign_request_streaming_through_a_dedicated_block_fails() -> None:
    """E: a foreign request streamed through the whole span of the arms; it finished after
    them, so the finished counter did not see it. The running requests do."""
    own, metrics = own_series()
    seen = [MetricSample(t_s=m.t_s, num_requests_waiting=0.0,
                         num_requests_running=(m.num_requests_running or 0.0) + 1.0,
                         requests_finished=m.requests_finished) for m in metrics]
    load = block_load("dedicated", 0, 0.0, 10.0, own, seen, [], arms_from=3.0)
    assert load.verdict == "failed" and load.basis is None
    assert load.foreign_running == 1
    assert load.reasons[0].startswith("the server held 2 requests at t=3.2 s (running and "
                                      "waiting) while the run's own in flight were 1")


def test_series_f_the_runs_failed_requests_do_not_hide_foreign_ones() -> None:
    """F: 5 of the run's own requests failed, uncounted by vLLM's request_success_total; 5
    foreign requests (short, between two scrapes) finished instead."""
    own, metrics = own_series()
    failed = [RequestRecord(request_id=f"x-{i}", sent_s=5.05 + 0.05 * i, end_s=5.1 + 0.05 * i,
                            status="error", source="clean", regime="dedicated", block=1,
                            error="HTTP 500") for i in range(5)]
    rose = [MetricSample(t_s=m.t_s, num_requests_waiting=0.0,
                         num_requests_running=m.num_requests_running,
                         requests_finished=(m.requests_finished or 0.0) + 5.0 * (m.t_s > 5.5))
            for m in metrics]  # 5 foreign ones ended between 5.25 and 5.75 s
    load = block_load("dedicated", 0, 0.0, 10.0, own + failed, rose, [], arms_from=3.0)
    assert load.verdict == "failed" and load.foreign_requests == 5
    assert load.reasons[0].startswith("5 requests not ours (at least)")


def test_series_g_an_external_compressor_on_another_server_is_not_own() -> None:
    """G: 10 requests to the external compressor (another server) counted as the run's own,
    which hid 10 foreign ones."""
    own, metrics = own_series()
    external = [arm(10 + i, 5.3 + 0.01 * i, 5.4 + 0.01 * i, "external/compressor")
                for i in range(10)]
    rose = [MetricSample(t_s=m.t_s, num_requests_waiting=0.0,
                         num_requests_running=m.num_requests_running,
                         requests_finished=(m.requests_finished or 0.0) + 10.0 * (m.t_s > 5.5))
            for m in metrics]
    load = block_load("dedicated", 0, 0.0, 10.0, own + external, rose, [], arms_from=3.0)
    assert load.verdict == "failed" and load.foreign_requests == 10
    # EXTERNAL_URL naming the served server: its requests are the run's own there
    here = block_load("dedicated", 0, 0.0, 10.0, own + external, rose, [], arms_from=3.0,
                      external_here=True)
    assert here.verdict == "verified", here.reasons + here.unverified
    # the self compressor runs on the served server: its requests are own
    selfs = [arm(10 + i, 5.3 + 0.01 * i, 5.4 + 0.01 * i, "self/compressor") for i in range(10)]
    assert block_load("dedicated", 0, 0.0, 10.0, own + selfs, rose, [],
                      arms_from=3.0).verdict == "verified"


def test_a_dedicated_block_with_too_few_samples_is_unverified() -> None:
    own, metrics = own_series()
    load = block_load("dedicated", 0, 0.0, 10.0, own, metrics[::3], [], arms_from=3.0)
    assert load.verdict == "unverified" and load.basis is None
    assert f"fewer than the {MIN_SAMPLES}" in load.unverified[0]
