"""Per-replica accounting (counters vs attributed records) and the continuation's cache hit rate,
on synthetic replica lines and request records whose truth is known."""

from __future__ import annotations

from compaction_bench.bench.analysis.replicas import continuation_cache, replica_account
from compaction_bench.transport.client import RequestRecord


def _line(t: float, replica: str, finished: float, *, routed: float, queries: float,
          hits: float, waiting: float = 0.0, queue: tuple[float, float] = (0.0, 0.0)
          ) -> dict[str, object]:
    return {"t_s": t, "replica": replica, "requests_finished": finished,
            "routed_requests": routed, "prefix_cache_queries": queries,
            "prefix_cache_hits": hits, "num_requests_waiting": waiting,
            "queue_time_sum_s": queue[0], "queue_time_count": queue[1]}


def _request(rid: str, end: float, *, prompt: int, cached: int, source: str = "clean",
             session: str = "s", sent: float | None = None, block: int = 1) -> RequestRecord:
    return RequestRecord(request_id=rid, sent_s=end - 0.5 if sent is None else sent,
                         status="ok", source=source, regime="dedicated", block=block,
                         end_s=end, prompt_tokens=prompt, cached_tokens=cached,
                         session_id=session)


def test_counters_give_each_replicas_deltas_and_records_are_attributed_where_alone() -> None:
    lines = [
        _line(0.0, "a", 10, routed=12, queries=1000, hits=100, queue=(1.0, 10)),
        _line(0.0, "b", 4, routed=5, queries=500, hits=0),
        _line(1.0, "a", 11, routed=13, queries=1400, hits=400, waiting=2, queue=(1.5, 11)),
        _line(1.0, "b", 4, routed=5, queries=500, hits=0),
        _line(2.0, "a", 11, routed=13, queries=1400, hits=400, queue=(1.5, 11)),
        _line(2.0, "b", 5, routed=7, queries=800, hits=200, waiting=1),
        {"t_s": 3.0, "replica": "b", "error": "connection refused"},
    ]
    requests = [_request("r1", 0.8, prompt=400, cached=300),  # only a rose in (0, 1]
                _request("r2", 1.7, prompt=300, cached=200),  # only b rose in (1, 2]
                _request("late", 9.0, prompt=1, cached=1)]  # after the last scrape: outside
    account = replica_account(lines, requests)
    assert account is not None
    a, b = account.replicas
    assert (a.replica, a.routed, a.finished, a.prompt_tokens, a.cached_tokens) == (
        "a", 1.0, 1.0, 400.0, 300.0)
    assert a.hit_rate == 0.75 and a.queue_time_mean_s == 0.5
    assert (a.waiting_mean, a.waiting_max) == (2 / 3, 2.0)
    assert (b.routed, b.finished, b.prompt_tokens, b.cached_tokens) == (2.0, 1.0, 300.0, 200.0)
    assert b.queue_time_mean_s is None  # its queue counters never moved: no mean to give
    assert (b.samples, b.failed_scrapes) == (3, 1)
    assert account.routed_total == 3.0
    assert account.span_s == (0.0, 3.0) and account.requests_ok == 2
    assert (a.inferred_requests, a.inferred_prompt_tokens, a.inferred_cached_tokens) == (
        1, 400, 300)
    assert (b.inferred_requests, b.inferred_cached_tokens) == (1, 200)
    assert account.attributed == 2 and not account.unattributed_reasons


def test_a_request_both_replicas_finished_around_is_counted_unattributed() -> None:
    lines = [_line(0.0, "a", 0, routed=0, queries=0, hits=0),
             _line(0.0, "b", 0, routed=0, queries=0, hits=0),
             _line(1.0, "a", 1, routed=1, queries=10, hits=0),
             _line(1.0, "b", 1, routed=1, queries=10, hits=0)]
    account = replica_account(lines, [_request("r", 0.9, prompt=10, cached=0)])
    assert account is not None and account.attributed == 0
    assert account.unattributed_reasons == {"ambiguous": 1}
    assert replica_account([], []) is None  # one server: no replica section at all


def test_the_fork_request_and_the_later_ones_are_rated_apart_per_arm() -> None:
    requests = [
        # clean: fork fully cached, later ones half
        _request("c0", 1.0, prompt=100, cached=100, session="c", sent=0.0),
        _request("c1", 2.0, prompt=200, cached=100, session="c", sent=1.5),
        _request("c2", 3.0, prompt=300, cached=150, session="c", sent=2.5),
        # external: its rewrite broke the prefix at the fork; later ones hit
        _request("e0", 1.0, prompt=100, cached=0, source="external", session="e", sent=0.1),
        _request("e1", 2.0, prompt=200, cached=180, source="external", session="e", sent=1.2),
        # a second block's attempt: its own fork
        _request("e2", 5.0, prompt=100, cached=10, source="external", session="e2", sent=4.0,
                 block=2),
        # not an arm's own request: never counted
        _request("x", 1.0, prompt=999, cached=999, source="external/compressor", session="e"),
        _request("y", 1.0, prompt=999, cached=999, source="background", session="bg"),
    ]
    rates = {c.arm: c for c in continuation_cache(requests, ("clean", "external"))}
    assert set(rates) == {"clean", "external"}
    clean, external = rates["clean"], rates["external"]
    assert (clean.first.n_requests, clean.first.hit_rate) == (1, 1.0)
    assert (clean.later.n_requests, clean.later.hit_rate) == (2, 0.5)
    assert (clean.all.prompt_tokens, clean.all.cached_tokens) == (600, 350)
    assert (external.first.n_requests, external.first.prompt_tokens,
            external.first.cached_tokens) == (2, 200, 10)
    assert (external.later.n_requests, external.later.hit_rate) == (1, 0.9)
