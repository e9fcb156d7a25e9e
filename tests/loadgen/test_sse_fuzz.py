"""Fuzzing the stream parsers: the SSE decoder, the chunked-transfer decoder and the client's
event handling, on arbitrary bytes split arbitrarily. 0 tracebacks: the decoders never raise
(the de-chunker only its documented ValueError), and a bad stream is an error record."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from hypothesis import example, given
from hypothesis import strategies as st

from compaction_bench.transport.client import StreamClient, prepare
from compaction_bench.transport.sse import Dechunker, SSEDecoder


def reference_events(data: bytes) -> list[bytes]:
    """The SSE specification's event stream interpretation, written plainly (no incremental
    state): every line end is CRLF, LF or CR; a blank line dispatches the data lines so far."""
    *complete, _unterminated = re.split(rb"\r\n|\r|\n", data)
    events, lines = [], []
    for line in complete:
        if not line:
            if lines:
                events.append(b"\n".join(lines))
                lines = []
        elif line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            lines.append(b"")
    return events


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


_SSE_BYTES = st.lists(st.sampled_from(
    [b"data:", b"data: ", b"data", b"\r", b"\n", b"\r\n", b":", b" ", b"x", b"{}", b"[DONE]",
     b"event: e", b"id: 1", b"\xff", b"\x00"]), max_size=40).map(b"".join)
_CUTS = st.lists(st.integers(min_value=0, max_value=400), max_size=12)


@given(st.one_of(_SSE_BYTES, st.binary(max_size=300)), _CUTS)
@example(b"data: x\r\n\r", [8])  # a CRLF split in the middle, then a CR blank line
@example(b"data: w\r\r", [8])
def test_sse_decoder_gives_the_specified_events_for_any_split(data: bytes,
                                                              cuts: list[int]) -> None:
    decoder = SSEDecoder()
    got = [event for part in split(data, cuts) for event in decoder.feed(part)]
    assert got == reference_events(data)


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), _CUTS)
def test_dechunker_round_trips_any_payload_in_any_split(parts: list[bytes],
                                                        cuts: list[int]) -> None:
    body = chunked(parts)
    decoder = Dechunker()
    out = b"".join(decoder.feed(piece) for piece in split(body, cuts))
    assert out == b"".join(parts) and decoder.finished


@given(st.one_of(st.binary(max_size=200), st.lists(st.sampled_from(
    [b"5\r\n", b"hello", b"\r\n", b"-3\r\n", b"zz\r\n", b"0\r\n", b"ffffffffffff\r\n", b";x",
     b"\xff"]), max_size=12).map(b"".join)), _CUTS)
@example(b"-3\r\nabc\r\n0\r\n\r\n", [])
def test_dechunker_refuses_garbage_only_with_value_error(data: bytes, cuts: list[int]) -> None:
    decoder = Dechunker()
    try:
        for piece in split(data, cuts):
            assert isinstance(decoder.feed(piece), bytes)
    except ValueError as exc:
        assert "chunk" in str(exc)


# --- the client's handling of whatever the stream says -------------------------------------------

def _content(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(
                         ["choices", "delta", "content", "tool_calls", "index", "function",
                          "name", "arguments", "usage", "error", "finish_reason", "reasoning",
                          "prompt_tokens_details", "cached_tokens", "id"]), inner, max_size=4),
                     max_leaves=12)
_EVENT = st.one_of(
    _JSON.map(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"),
    st.sampled_from([b"data: [DONE]\n\n", b"data: 1\n\n", b"data: [1]\n\n",
                     b'data: {"choices":[1]}\n\n', b"data: {\n\n", b": ping\n\n",
                     b"data: \xff\xfe\n\n", _content("hi"), b"data: " + b"[" * 5000 + b"\n\n"]),
    st.binary(max_size=30))


def _decode(reads: list[bytes]) -> tuple[str, str | None, int]:
    ticks: Iterator[float] = iter(float(i) for i in range(10_000))
    client = StreamClient(clock=lambda: next(ticks))
    request = prepare("http://scripted.invalid/v1", {"model": "m", "messages": []},
                      request_id="fuzz")
    response = client.decode(reads, request)
    return response.record.status, response.record.error, len(response.record.chunk_times_s)


@given(st.lists(_EVENT, max_size=8), _CUTS)
@example([b"data: 1\n\n"], [])
@example([b"data: [1]\n\n"], [])
@example([b'data: {"choices":[1]}\n\n'], [])
@example([b"data: " + b"[" * 100_000 + b"\n\n"], [3])  # nesting past the recursion limit
@example([b'data: {"choices":[{"delta":{"tool_calls":[{"index":true}]}}]}\n\n'], [])
def test_decode_never_raises_and_a_bad_stream_is_an_error_record(events: list[bytes],
                                                                 cuts: list[int]) -> None:
    stream = b"".join(events)
    status, error, _ = _decode(split(stream, cuts))
    assert status in ("ok", "error")
    if status == "ok":
        assert error is None and b"data: [DONE]" in stream
    else:
        assert error


def test_malformed_events_the_issue_names_are_error_records() -> None:
    for event in (b"data: 1\n\n", b"data: [1]\n\n", b'data: {"choices":[1]}\n\n'):
        status, error, _ = _decode([_content("a"), event, b"data: [DONE]\n\n"])
        assert status == "error" and error is not None and "malformed stream event" in error
