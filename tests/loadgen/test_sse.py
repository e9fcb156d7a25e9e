"""Our streaming client against the fake server, whose delays are known exactly."""

from __future__ import annotations

import itertools
import socket
import statistics
import threading

from loadgen.fakeserver import FakeProcess
from loadgen.sse import StreamClient, StreamResult, _Dechunker, prepare, send_once

MESSAGES = [{"role": "user", "content": "hello"}]


def _gaps(result: StreamResult) -> list[float]:
    times = result.chunk_times_s
    return [b - a for a, b in itertools.pairwise(times)]


def test_timing_matches_the_known_delays(fake: FakeProcess) -> None:
    client = StreamClient()
    results = [client.send(prepare(fake.api_url, {"model": "target", "messages": MESSAGES},
                                   request_id=f"r{i}")) for i in range(3)]
    client.close()
    for r in results:
        assert r.status == "ok", r.error
        assert r.first_token_s is not None and r.end_s is not None
        # generous bounds: the machine is shared and noisy; the truth is 200 ms / 20 ms
        assert 0.19 <= r.first_token_s - r.sent_s <= 0.40
        assert 0.015 <= statistics.median(_gaps(r)) <= 0.045
        assert len(r.chunk_times_s) == 20 and r.chunk_times_s[0] == r.first_token_s
        assert r.prompt_tokens and r.prompt_tokens > 0
        assert r.completion_tokens == 20 and r.cached_tokens == min(16, r.prompt_tokens)
        assert r.finish_reason == "length"


def test_concurrent_streams_in_threads(fake: FakeProcess) -> None:
    results: list[StreamResult] = []

    def one(i: int) -> None:
        results.append(send_once(fake.api_url, {"model": "target", "messages": MESSAGES,
                                                "max_tokens": 10}, request_id=f"c{i}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.status == "ok" for r in results)
    assert all(len(r.chunk_times_s) == 10 for r in results)
    assert statistics.median(r.first_token_s - r.sent_s for r in results  # type: ignore[operator]
                             ) < 0.45


def test_connection_refused_is_an_error_record() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = send_once(f"http://127.0.0.1:{port}/v1", {"model": "target", "messages": MESSAGES},
                  request_id="dead")
    assert r.status == "error" and r.error is not None
    assert "connection refused" in r.error and "make serve" in r.error
    assert r.end_s is not None and r.first_token_s is None


def test_server_closing_mid_stream_is_an_error_without_retry(fake: FakeProcess) -> None:
    before = fake.stats()["requests"]
    r = send_once(fake.api_url, {"model": "target", "messages": MESSAGES,
                                 "fake": {"fail_after_tokens": 3}}, request_id="cut")
    assert r.status == "error" and r.error is not None
    assert "3 tokens" in r.error
    assert len(r.chunk_times_s) == 3
    assert fake.stats()["requests"] == before + 1  # sent once, never retried


def test_http_error_status_is_recorded_once(fake: FakeProcess) -> None:
    before = fake.stats()["requests"]
    client = StreamClient()
    r = client.send(prepare(fake.api_url, {"model": "target", "messages": MESSAGES,
                                           "fake": {"status": 503}}, request_id="503"))
    assert r.status == "error" and r.http_status == 503 and "HTTP 503" in (r.error or "")
    ok = client.send(prepare(fake.api_url, {"model": "target", "messages": MESSAGES,
                                            "max_tokens": 2}, request_id="after"))
    assert ok.status == "ok"  # the client recovers for the next request
    client.close()
    assert fake.stats()["requests"] == before + 1  # the injected failure is not counted


def test_non_streaming_request(fake: FakeProcess) -> None:
    r = send_once(fake.api_url, {"model": "target", "messages": MESSAGES, "stream": False,
                                 "max_tokens": 5}, request_id="whole")
    assert r.status == "ok" and r.completion_tokens == 5 and r.chunk_times_s == []
    assert r.end_s is not None and 0.25 <= r.end_s - r.sent_s <= 0.6


def test_record_has_the_schema_fields(fake: FakeProcess) -> None:
    r = send_once(fake.api_url, {"model": "target", "messages": MESSAGES, "max_tokens": 3},
                  request_id="rec")
    record = r.record(regime="shared", source="clean", block=2, origin_s=r.sent_s)
    for key in ("regime", "block", "source", "request_id", "intended_send_s", "sent_s",
                "first_token_s", "end_s", "chunk_times_s", "prompt_tokens", "cached_tokens",
                "completion_tokens", "reasoning_tokens", "status", "error"):
        assert key in record
    assert record["sent_s"] == 0.0 and record["first_token_s"] > 0.15
    assert len(record["chunk_times_s"]) == 3


def test_dechunker_handles_any_split() -> None:
    body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    for size in (1, 2, 3, 7, len(body)):
        d = _Dechunker()
        out = b"".join(d.feed(body[i:i + size]) for i in range(0, len(body), size))
        assert out == b"hello world" and d.finished
