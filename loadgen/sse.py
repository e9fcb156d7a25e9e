"""Our streaming chat client: one request, every SSE event stamped on arrival.

Measurement contract:
- One clock for everything: `time.monotonic` (the suite's clock, `histories/timing.py`), unless
  a `clock` is injected. Stamps are raw seconds on that clock, never rounded.
- The body is serialized by `prepare()` before the clock starts; `sent_s` is stamped right
  before the connection is opened (or reused) and the request written.
- The response is read with `HTTPResponse.read1`, which returns whatever one socket read
  delivered (one HTTP chunk at most): no line buffering, no "wait for 1 KiB". Events are split
  on the SSE blank line here, and every event is stamped with the time of the read that
  completed it. `first_token_s` is the first event carrying generated text (content, reasoning
  or a tool-call delta); `chunk_times_s` holds one stamp per such event.
- Timeouts are explicit and long: `connect_timeout_s` for the TCP connect, `read_timeout_s` as
  the longest silence tolerated while waiting (a queued request under overload can wait minutes
  for its first token). No retries, ever: a failure is returned as `status="error"` with a
  message, never raised, and never re-sent.
- Built on `http.client` and plain sockets, so it runs in plain threads and, unchanged, under
  gevent's monkey-patching inside locust (where the socket waits become cooperative).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Clock = Callable[[], float]
CHAT_PATH = "/chat/completions"


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready to send: the body is already bytes, so no serialization is timed."""

    url: str
    body: bytes
    request_id: str
    intended_send_s: float | None = None
    stream: bool = True


@dataclass
class StreamResult:
    """What one request did. Times are raw clock seconds; see the module contract."""

    request_id: str
    intended_send_s: float | None
    sent_s: float
    first_token_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    status: str = "error"
    error: str | None = None
    http_status: int | None = None
    finish_reason: str | None = None
    text_chars: int = 0

    def record(self, *, regime: str, source: str, block: int | None,
               origin_s: float = 0.0, **extra: Any) -> dict[str, Any]:
        """The `requests.jsonl` line (bench/summary_schema.md, schema 1); times minus origin."""
        def rel(value: float | None) -> float | None:
            return None if value is None else value - origin_s

        return {
            "regime": regime, "block": block, "source": source,
            "request_id": self.request_id,
            "intended_send_s": rel(self.intended_send_s), "sent_s": self.sent_s - origin_s,
            "first_token_s": rel(self.first_token_s), "end_s": rel(self.end_s),
            "chunk_times_s": [t - origin_s for t in self.chunk_times_s],
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "status": self.status, "error": self.error,
            "http_status": self.http_status, "finish_reason": self.finish_reason,
            **extra,
        }


def chat_url(api_url: str) -> str:
    """`http://host:port/v1` (the OpenAI base URL) -> its chat completions URL."""
    return api_url.rstrip("/") + CHAT_PATH


def prepare(api_url: str, payload: dict[str, Any], *, request_id: str,
            intended_send_s: float | None = None) -> PreparedRequest:
    """Serialize a chat request once. Streaming requests ask for usage in the last chunk."""
    body = dict(payload)
    stream = bool(body.setdefault("stream", True))
    if stream:
        options = dict(body.get("stream_options") or {})
        options.setdefault("include_usage", True)
        body["stream_options"] = options
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return PreparedRequest(url=chat_url(api_url), body=data, request_id=request_id,
                           intended_send_s=intended_send_s, stream=stream)


class StreamClient:
    """Sends prepared requests over one kept-alive connection. One client per thread/greenlet."""

    def __init__(self, *, connect_timeout_s: float = 10.0, read_timeout_s: float = 3600.0,
                 clock: Clock = time.monotonic) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.clock = clock
        self._conn: http.client.HTTPConnection | None = None
        self._netloc: str | None = None
        # The request being sent, so a caller interrupted mid-request (a greenlet killed when
        # locust stops) can still record what had arrived.
        self.current: StreamResult | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

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

    def send(self, request: PreparedRequest) -> StreamResult:
        """Send once and read to the end. Never raises for transport or server errors."""
        parsed = urllib.parse.urlsplit(request.url)
        path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        result = StreamResult(request.request_id, request.intended_send_s, self.clock())
        self.current = result
        try:
            conn = self._connection(parsed)
            conn.request("POST", path, body=request.body, headers={
                "Content-Type": "application/json", "Accept": "text/event-stream",
                "X-Request-Id": request.request_id})
            response = conn.getresponse()
            result.http_status = response.status
            if response.status != 200:
                detail = response.read(4096).decode("utf-8", "replace").strip()
                result.end_s = self.clock()
                result.error = f"HTTP {response.status} from {request.url}: {detail[:500]}"
                self.close()
                return result
            if request.stream:
                self._read_stream(response, result)
            else:
                self._read_whole(response, result)
            if response.will_close:
                self.close()
        except ConnectionRefusedError:
            self._fail(result, f"connection refused by {request.url} (is the server running? "
                       "start one with `make serve`, or pass its base URL)")
        except (http.client.IncompleteRead, ConnectionResetError) as exc:
            self._fail(result, f"server closed the connection mid-stream after "
                       f"{len(result.chunk_times_s)} tokens ({type(exc).__name__}) on "
                       f"{request.url}")
        except TimeoutError as exc:
            self._fail(result, f"timed out on {request.url} ({exc or 'no data'}; connect "
                       f"{self.connect_timeout_s}s, read silence {self.read_timeout_s}s)")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._fail(result, f"{type(exc).__name__} on {request.url}: {exc}".rstrip(": "))
        self.current = None
        return result

    def _fail(self, result: StreamResult, message: str) -> None:
        result.end_s = self.clock()
        result.status, result.error = "error", message
        self.close()

    def _read_stream(self, response: http.client.HTTPResponse, result: StreamResult) -> None:
        # The body is read straight from the connection's buffered file with one `read1` per
        # arrival (no line reads), and de-chunked here: per event this costs a fraction of
        # http.client's chunk handling, which matters with hundreds of streams in one process.
        fp = response.fp
        assert fp is not None
        dechunk = _Dechunker() if response.chunked else None
        buffer = b""
        done = False
        events = 0
        while not done:
            data = fp.read1(65536)
            now = self.clock()
            if not data:
                break
            buffer += dechunk.feed(data) if dechunk is not None else data
            while not done:
                cut = buffer.find(b"\n\n")
                if cut < 0:
                    break
                event, buffer = buffer[:cut], buffer[cut + 2:]
                events += 1
                done = self._event(event, now, result)
            result.end_s = now
        if done:
            result.status, result.error = "ok", None
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
            result.status = "error"
            result.error = (f"stream ended before [DONE] after {events} events and "
                            f"{len(result.chunk_times_s)} tokens (server closed the connection)")
            self.close()

    def _event(self, event: bytes, now: float, result: StreamResult) -> bool:
        """Handle one SSE event; True on `[DONE]`."""
        payload = b"".join(line[5:].lstrip() for line in event.split(b"\n")
                           if line.startswith(b"data:"))
        if not payload:
            return False  # comment or keep-alive
        if payload == b"[DONE]":
            return True
        chunk = json.loads(payload)
        if "error" in chunk and not chunk.get("choices"):
            raise ValueError(f"server error in stream: {chunk['error']}")
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or "") + (
                delta.get("reasoning") or "")
            if text or delta.get("tool_calls"):
                if result.first_token_s is None:
                    result.first_token_s = now
                result.chunk_times_s.append(now)
                result.text_chars += len(text)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            _take_usage(chunk["usage"], result)
        return False

    def _read_whole(self, response: http.client.HTTPResponse, result: StreamResult) -> None:
        data = response.read()
        result.end_s = self.clock()
        body = json.loads(data)
        choice = (body.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        result.text_chars = len(message.get("content") or "")
        result.finish_reason = choice.get("finish_reason")
        _take_usage(body.get("usage") or {}, result)
        result.status = "ok"


class _Dechunker:
    """Incremental HTTP/1.1 chunked-transfer decoder: `feed(raw) -> payload bytes`."""

    def __init__(self) -> None:
        self.raw = b""
        self.left = 0  # payload bytes still due in the current chunk
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        while self.raw and not self.finished:
            if self.left > 0:
                take = self.raw[:self.left]
                out.append(take)
                self.left -= len(take)
                self.raw = self.raw[len(take):]
                if self.left:
                    break
                self.left = -2  # the CRLF after a chunk's payload
            if self.left < 0:
                if len(self.raw) < 2:
                    break
                self.raw, self.left = self.raw[2:], 0
                continue
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self.raw[:line_end].split(b";", 1)[0], 16)
            self.raw = self.raw[line_end + 2:]
            if size == 0:
                self.finished = True  # trailers, if any, are ignored
                break
            self.left = size
        return b"".join(out)


def _take_usage(usage: dict[str, Any], result: StreamResult) -> None:
    result.prompt_tokens = usage.get("prompt_tokens")
    result.completion_tokens = usage.get("completion_tokens")
    prompt_details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = prompt_details.get("cached_tokens")
    completion_details = usage.get("completion_tokens_details") or {}
    result.reasoning_tokens = completion_details.get("reasoning_tokens")


_ADDRESSES: dict[tuple[str, int], tuple[Any, ...]] = {}


def _open_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A connected TCP socket. Names are resolved once per process and cached: gevent's
    resolver hands every lookup to a thread pool, which cost tens of ms per new connection."""
    key = (host, port)
    if key not in _ADDRESSES:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        _ADDRESSES[key] = (family, kind, proto, address)
    family, kind, proto, address = _ADDRESSES[key]
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
              read_timeout_s: float = 3600.0, clock: Clock = time.monotonic) -> StreamResult:
    """One request on a fresh connection (convenience for scripts and tests)."""
    client = StreamClient(read_timeout_s=read_timeout_s, clock=clock)
    try:
        return client.send(prepare(api_url, payload, request_id=request_id))
    finally:
        client.close()
