"""Our streaming chat client: one request, every SSE event stamped on arrival. The one client
of the suite: the arms, their compressors and the background users all send through it, and
`make bench-client` measures it against vLLM's and AIPerf's clients.

Measurement contract:
- One clock for everything: `common.timing.monotonic`, unless a `clock` is injected. Stamps are
  raw seconds on that clock, never rounded.
- The body is serialized by `prepare()` before the clock starts; `sent_s` is stamped right
  before the connection is opened (or reused) and the request written.
- The response is read with `read1`, which returns whatever one socket read delivered (one HTTP
  chunk at most): no line buffering, no "wait for 1 KiB". Events are decoded by
  `transport.sse.SSEDecoder` (every separator the SSE specification allows) and every event is
  stamped with the time of the read that completed it. `first_token_s` is the first event
  carrying generated text (content, reasoning or a tool-call delta); `chunk_times_s` holds one
  stamp per such event; `end_s` is the stamp of the read that completed the response. So
  `end_s - first_token_s` = the sum of inter-token gaps + (end_s - last token), exactly.
- Timeouts are explicit: `connect_timeout_s` for the TCP connect, `read_timeout_s` as the
  longest silence tolerated (an inactivity deadline: a queued request under overload can wait
  minutes for its first token, a stalled stream is cut when it has said nothing for that long).
  No retries, ever: a failure is returned as `status="error"` with a message, never raised and
  never re-sent. Malformed events (`data: 1`, `{"choices": [1]}`) are failures too.
- A request in flight can be aborted from another thread (`abort`, or `abort_all` for every
  client of the process: Ctrl-C, a wall-time limit): its socket is shut down, the blocked read
  returns at once, and the record says `aborted: <reason>` with what had arrived.
- Built on `http.client` and plain sockets, so it runs in plain threads and, unchanged, under
  gevent's monkey-patching inside locust (where the socket waits become cooperative). Names are
  resolved per connection (nothing is cached process-wide); IP literals skip the resolver.

Its size (about 450 lines) is kept on purpose: the read loop, its timeouts, the abort registry
and the usage and token-id capture share one timing contract, and splitting them would put a
module boundary inside the measured path.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import select
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.transport.prefixhash import prefix_label
from compaction_bench.transport.request import PreparedRequest, RequestRecord, Response, prepare
from compaction_bench.transport.sse import Dechunker, SSEDecoder

__all__ = ["PreparedRequest", "RequestRecord", "Response", "StreamClient", "abort_all",
           "prepare", "send_once"]

_LIVE: weakref.WeakSet[StreamClient] = weakref.WeakSet()  # every client of this process
_LIVE_LOCK = threading.Lock()


class _Activity:
    """Requests in flight in this process and the last time any of them received data (the
    bench's watchdog: a server that answers /health but no longer streams)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.last_data_s = time.monotonic()


_ACTIVITY = _Activity()


def activity() -> tuple[int, float]:
    """(requests in flight in this process, time.monotonic() of the last data received or
    request sent)."""
    return _ACTIVITY.in_flight, _ACTIVITY.last_data_s


def abort_all(reason: str) -> int:
    """Abort the request in flight of every client in this process; the number aborted."""
    with _LIVE_LOCK:
        clients = list(_LIVE)
    return sum(client.abort(reason) for client in clients)

class _Stream:
    """What has arrived so far for one request (mutable while the request runs)."""

    def __init__(self, request: PreparedRequest, sent_s: float) -> None:
        self.request = request
        self.sent_s = sent_s
        self.first_token_s: float | None = None
        self.chunk_times: list[float] = []
        self.end_s: float | None = None
        self.usage: dict[str, Any] = {}
        self.served_model: str | None = None  # the first `model` the response names
        self.spec_decode: dict[str, int] | None = None  # speculative decoding, where stated
        self.finish_reason: str | None = None
        self.http_status: int | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        # token ids, where the request asked for them (`return_token_ids`): kept only as the
        # `kv_prefix` label's unit hashes (transport.prefixhash), for cache-break accounting
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] = []
        self.events = 0
        self.status = "error"
        self.error: str | None = None

    def take(self, delta: dict[str, Any], now: float, *, stamp: bool = True) -> None:
        """Absorb one delta (or a whole non-streamed message with `stamp=False`: no token times
        exist then, so none are invented)."""
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        calls = delta.get("tool_calls")
        generated = False
        if isinstance(content, str) and content:
            self.content.append(content)
            generated = True
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            generated = True
        if isinstance(calls, list) and calls:
            generated = True
            for number, call in enumerate(calls):
                if not isinstance(call, dict):
                    raise ValueError("a tool-call delta is not an object")
                index = call.get("index", number)
                slot = self.calls.setdefault(index if isinstance(index, int) else number, {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                if isinstance(call.get("id"), str):
                    slot["id"] = call["id"]
                function = call.get("function")
                if isinstance(function, dict):
                    slot["function"]["name"] += str(function.get("name") or "")
                    slot["function"]["arguments"] += str(function.get("arguments") or "")
        if generated and stamp:
            if self.first_token_s is None:
                self.first_token_s = now
            self.chunk_times.append(now)

    def response(self) -> Response:
        usage = self.usage
        prompt_details = usage.get("prompt_tokens_details")
        completion_details = usage.get("completion_tokens_details")
        content, reasoning = "".join(self.content), "".join(self.reasoning)
        record = RequestRecord(
            request_id=self.request.request_id, sent_s=self.sent_s, status=self.status,
            model=self.request.model, served_model=self.served_model,
            intended_send_s=self.request.intended_send_s,
            first_token_s=self.first_token_s, end_s=self.end_s,
            chunk_times_s=tuple(self.chunk_times),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            cached_tokens=_int(prompt_details.get("cached_tokens"))
            if isinstance(prompt_details, dict) else None,
            completion_tokens=_int(usage.get("completion_tokens")),
            reasoning_tokens=_int(completion_details.get("reasoning_tokens"))
            if isinstance(completion_details, dict) else None,
            error=self.error, http_status=self.http_status, finish_reason=self.finish_reason,
            text_chars=len(content) + len(reasoning), session_id=self.request.session_id,
            spec_decode=self.spec_decode,
            labels={"kv_prefix": prefix_label(self.prompt_ids, self.output_ids)}
            if self.prompt_ids is not None else {})
        calls = tuple(self.calls[i] for i in sorted(self.calls))
        return Response(record=record, content=content, reasoning=reasoning, tool_calls=calls)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StreamClient:
    """Sends prepared requests over one kept-alive connection. One client per thread/greenlet."""

    def __init__(self, *, connect_timeout_s: float = 10.0, read_timeout_s: float = 3600.0,
                 clock: Clock = monotonic) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.clock = clock
        self._conn: http.client.HTTPConnection | None = None
        self._netloc: str | None = None
        # The request being sent, so a caller interrupted mid-request (a greenlet killed when
        # locust stops) can still record what had arrived: `partial()`.
        self._current: _Stream | None = None
        self._cut: _Stream | None = None  # a request a greenlet kill or Ctrl-C cut mid-way
        self._aborted: str | None = None
        with _LIVE_LOCK:
            _LIVE.add(self)

    def abort(self, reason: str) -> bool:
        """Cut the request in flight (from any thread); True when there was one. The client
        stays usable: the next `send` opens a fresh connection."""
        current, conn = self._current, self._conn
        if current is None:
            return False
        self._aborted = reason
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: the read ends on its own
                sock.shutdown(socket.SHUT_RDWR)
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def partial(self, error: str) -> Response | None:
        """What the request in flight had received, as a failed response (None: none). Also
        the request an exception that is not a transport error (a greenlet killed when the load
        stops, Ctrl-C) cut out of `send`: its caller records it from its handler."""
        current = self._current or self._cut
        self._cut = None
        if current is None:
            return None
        current.status, current.error = "error", error
        current.end_s = self.clock()
        return current.response()

    def _connection(self, parsed: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        if self._conn is not None and (self._netloc != parsed.netloc or _peer_closed(self._conn)):
            self.close()  # nothing was sent on it yet: reconnecting is not a retry
        if self._conn is None:
            host = parsed.hostname or "127.0.0.1"
            conn: http.client.HTTPConnection
            if parsed.scheme == "https":
                conn = http.client.HTTPSConnection(host, parsed.port,
                                                   timeout=self.connect_timeout_s)
                conn.connect()
            else:
                conn = http.client.HTTPConnection(host, parsed.port,
                                                  timeout=self.connect_timeout_s)
                conn.sock = _open_socket(host, parsed.port or 80, self.connect_timeout_s)
            if conn.sock is not None:
                conn.sock.settimeout(self.read_timeout_s)
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conn, self._netloc = conn, parsed.netloc
        return self._conn

    def send(self, request: PreparedRequest) -> Response:
        """Send once and read to the end. Never raises for transport or server errors."""
        parsed = urllib.parse.urlsplit(request.url)
        path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        got = _Stream(request, self.clock())
        self._aborted = None
        self._current = got
        with _ACTIVITY.lock:
            _ACTIVITY.in_flight += 1
            _ACTIVITY.last_data_s = time.monotonic()
        try:
            conn = self._connection(parsed)
            conn.request("POST", path, body=request.body, headers={
                "Content-Type": "application/json", "Accept": "text/event-stream",
                "X-Request-Id": request.request_id, **dict(request.headers)})
            response = conn.getresponse()
            got.http_status = response.status
            if response.status != 200:
                detail = response.read(4096).decode("utf-8", "replace").strip()
                got.end_s = self.clock()
                got.error = f"HTTP {response.status} from {request.url}: {detail[:500]}"
                self.close()
            elif request.stream:
                self._read_stream(response, got)
            else:
                self._read_whole(response, got)
            if got.status == "ok" and response.will_close:
                self.close()
        except ConnectionRefusedError:
            self._fail(got, f"connection refused by {request.url} (is the server running? "
                       "start one with `make serve`, or pass its URL)")
        except (http.client.IncompleteRead, ConnectionResetError, BrokenPipeError) as exc:
            self._fail(got, f"server closed the connection mid-stream after "
                       f"{len(got.chunk_times)} tokens ({type(exc).__name__}) on {request.url}")
        except TimeoutError as exc:
            self._fail(got, f"timed out on {request.url} ({exc or 'no data'}; connect "
                       f"{self.connect_timeout_s}s, longest silence {self.read_timeout_s}s) "
                       f"after {len(got.chunk_times)} tokens")
        except (OSError, http.client.HTTPException, ValueError, TypeError) as exc:
            self._fail(got, f"{type(exc).__name__} on {request.url}: {exc}".rstrip(": "))
        except BaseException:  # not the request's failure: kept for `partial`, then re-raised
            self._cut = got
            raise
        finally:
            self._current = None
            with _ACTIVITY.lock:
                _ACTIVITY.in_flight -= 1
        if self._aborted is not None:  # whatever the cut socket made of it, say why it ended
            self._fail(got, f"aborted: {self._aborted} (after {len(got.chunk_times)} tokens)")
            self._aborted = None
        return got.response()

    def _fail(self, got: _Stream, message: str) -> None:
        got.end_s = self.clock()
        got.status, got.error = "error", message
        self.close()

    def decode(self, reads: Iterable[bytes], request: PreparedRequest) -> Response:
        """Decode a streamed body given as raw reads (no HTTP chunking), each stamped by this
        client's clock as it is taken: the very path `send` uses, without a socket (tests on a
        scripted clock, replays of captured streams). `sent_s` is one clock reading first."""
        got = _Stream(request, self.clock())
        source = iter(reads)
        try:
            done = self._consume(lambda: next(source, b""), None, got)
        except (ValueError, TypeError) as exc:
            self._fail(got, f"{type(exc).__name__}: {exc}")
            return got.response()
        self._settle(done, got)
        return got.response()

    def _consume(self, read: Callable[[], bytes], dechunk: Dechunker | None,
                 got: _Stream) -> bool:
        """Read until [DONE] or the end of the body; True when [DONE] came. Every event is
        stamped with the time of the read that completed it, and handled right away: parsing
        all of a stream's events at its end was measured to delay other streams' last tokens
        (256 streams: inter-token p99 error 1.5 ms -> 40 ms), since streams end together."""
        decoder = SSEDecoder()
        while True:
            data = read()
            now = self.clock()
            if not data:
                return False
            _ACTIVITY.last_data_s = time.monotonic()  # one store: no lock on the hot path
            for event in decoder.feed(dechunk.feed(data) if dechunk is not None else data):
                got.events += 1
                if event == b"[DONE]":
                    got.end_s = now
                    return True
                self._event(event, now, got)
            got.end_s = now

    def _settle(self, done: bool, got: _Stream) -> None:
        if done:
            got.status, got.error = "ok", None
        else:
            got.status = "error"
            got.error = (f"stream ended before [DONE] after {got.events} events and "
                         f"{len(got.chunk_times)} tokens (server closed the connection)")

    def _read_stream(self, response: http.client.HTTPResponse, got: _Stream) -> None:
        # The body is read straight from the connection's buffered file with one `read1` per
        # arrival (no line reads), and de-chunked here: per event this costs a fraction of
        # http.client's chunk handling, which matters with hundreds of streams in one process.
        fp = response.fp
        assert fp is not None
        dechunk = Dechunker() if response.chunked else None
        done = self._consume(lambda: fp.read1(65536), dechunk, got)
        self._settle(done, got)
        if done:
            # read the chunked terminator, so the kept-alive connection starts clean
            while dechunk is not None and not dechunk.finished:
                more = fp.read1(65536)
                if not more:
                    break
                dechunk.feed(more)
            if dechunk is None or not dechunk.finished:
                self.close()
            response.close()  # closes the response's file only; the socket stays with us
        else:
            self.close()

    def _event(self, event: bytes, now: float, got: _Stream) -> None:
        """Handle one SSE event's data (stamped `now`). Malformed events raise ValueError."""
        try:
            chunk = json.loads(event)
        except (ValueError, RecursionError):  # RecursionError: arrays nested past the limit
            raise ValueError(f"malformed stream event (not JSON): {event[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise ValueError(f"malformed stream event (not an object): {event[:80]!r}")
        choices = chunk.get("choices")
        _take_model(got, chunk)
        _take_prompt_ids(got, chunk)
        if "error" in chunk and not choices:
            raise ValueError(f"server error in stream: {str(chunk['error'])[:300]}")
        if choices is not None and not isinstance(choices, list):
            raise ValueError(f"malformed stream event ('choices' is not a list): {event[:80]!r}")
        for choice in choices or ():
            if not isinstance(choice, dict):
                raise ValueError(f"malformed stream event (a choice is not an object): "
                                 f"{event[:80]!r}")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ValueError(f"malformed stream event ('delta' is not an object): "
                                 f"{event[:80]!r}")
            got.take(delta, now)
            _take_output_ids(got, choice)
            if isinstance(choice.get("finish_reason"), str):
                got.finish_reason = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            got.usage = chunk["usage"]
        _take_spec_decode(got, chunk)

    def _read_whole(self, response: http.client.HTTPResponse, got: _Stream) -> None:
        data = response.read()
        got.end_s = self.clock()
        try:
            body = json.loads(data)
        except RecursionError:
            raise ValueError(f"not a chat completion (nested too deeply): {data[:80]!r}") from None
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not (
                body["choices"]) or not isinstance(body["choices"][0], dict):
            raise ValueError(f"not a chat completion: {data[:120]!r}")
        choice = body["choices"][0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise ValueError("the completion's message is not an object")
        got.take(message, got.end_s, stamp=False)
        _take_model(got, body)
        _take_prompt_ids(got, body)
        _take_output_ids(got, choice)
        got.finish_reason = choice.get("finish_reason")
        if isinstance(body.get("usage"), dict):
            got.usage = body["usage"]
        _take_spec_decode(got, body)
        got.status = "ok"


# vLLM's per-request speculative-decoding metrics (`metrics.speculative_decoding` of the final
# usage chunk, or of a whole response: vllm/entrypoints/generate/base/protocol.py
# SpeculativeDecodingMetrics, vLLM 0.32) -> the record's names
SPEC_FIELDS = {"num_spec_steps": "steps", "num_draft_tokens": "draft_tokens",
               "num_accepted_draft_tokens": "accepted_tokens", "num_spec_tokens": "spec_tokens"}


def _take_spec_decode(got: _Stream, chunk: dict[str, Any]) -> None:
    metrics = chunk.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return
    values = {ours: spec.get(theirs) for theirs, ours in SPEC_FIELDS.items()}
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
        got.spec_decode = {k: int(v) for k, v in values.items() if v is not None}


def _take_model(got: _Stream, chunk: dict[str, Any]) -> None:
    if got.served_model is None and isinstance(chunk.get("model"), str):
        got.served_model = chunk["model"]


def _take_prompt_ids(got: _Stream, chunk: dict[str, Any]) -> None:
    """The rendered prompt's ids: vLLM sends them once, in the first chunk."""
    prompt = chunk.get("prompt_token_ids")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        got.prompt_ids = prompt


def _take_output_ids(got: _Stream, choice: dict[str, Any]) -> None:
    """A chunk's generated ids."""
    output = choice.get("token_ids")
    if isinstance(output, list):
        got.output_ids.extend(t for t in output if isinstance(t, int))


def _open_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket. An IP literal connects directly; a name is resolved for this
    connection only (no process-wide cache: a name's address may change)."""
    try:
        literal = ipaddress.ip_address(host)
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        address: tuple[Any, ...] = (host, port)
        kind, proto = socket.SOCK_STREAM, 0
    except ValueError:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _peer_closed(conn: http.client.HTTPConnection) -> bool:
    """True when an idle kept-alive socket is readable: the server closed (or broke) it."""
    if conn.sock is None:
        return True
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def send_once(api_url: str, payload: dict[str, Any], *, request_id: str,
              read_timeout_s: float = 3600.0, api_key: str | None = None,
              clock: Clock = monotonic, session_id: str | None = None) -> Response:
    """One request on a fresh connection (convenience for scripts and tests)."""
    client = StreamClient(read_timeout_s=read_timeout_s, clock=clock)
    try:
        return client.send(prepare(api_url, payload, request_id=request_id, api_key=api_key,
                                   session_id=session_id))
    finally:
        client.close()
