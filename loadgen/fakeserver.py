"""A fake OpenAI-compatible streaming server whose timing is known exactly.

It exists to measure clients against the truth (DESIGN: the one allowed fake). Every streamed
response puts its first token at `sent + ttft` and token i at `sent + ttft + i * itl` on the
event loop's monotonic clock, where `sent` is when the request's body was fully read. Events are
scheduled on absolute times, so a late wake-up never shifts later tokens; how late the server
itself wrote each event is kept and served at `/fake/stats`, so a client benchmark can tell
server lateness from client error.

Endpoints: POST /v1/chat/completions (stream and non-stream; honours `max_tokens` /
`max_completion_tokens`, else `--tokens`; `stream_options.include_usage`), GET /v1/models,
/health, /metrics (vllm:* gauges and counters), /fake/stats, /fake/reset. A request body may
carry `"fake": {"ttft_ms", "itl_ms", "fail_after_tokens", "status"}` to override timing or
inject a fault (close mid-stream after N tokens, or answer with an HTTP error status).

    python -m loadgen.fakeserver --port 8100 --ttft-ms 200 --itl-ms 20 --tokens 64

With `--port 0` it prints `listening on PORT` as its first stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FakeConfig:
    host: str = "127.0.0.1"
    port: int = 0
    ttft_ms: float = 200.0
    itl_ms: float = 20.0
    tokens: int = 64
    models: tuple[str, ...] = ("target", "compressor")
    max_model_len: int = 8192
    cached_tokens: int = 0


@dataclass
class _State:
    running: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    lateness_s: list[float] = field(default_factory=list)


class FakeServer:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.state = _State()
        self.port = config.port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, self.config.host,
                                                  self.config.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line)}
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                received = asyncio.get_running_loop().time()
                keep = headers.get("connection", "").lower() != "close"
                keep = await self._route(method, target.split("?")[0], body, received, writer) \
                    and keep
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _route(self, method: str, path: str, body: bytes, received: float,
                     writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            return await _respond(writer, 200, b"", "text/plain")
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "fake",
                     "max_model_len": self.config.max_model_len} for m in self.config.models]
            return await _respond_json(writer, 200, {"object": "list", "data": data})
        if path == "/metrics":
            return await _respond(writer, 200, self._metrics().encode(), "text/plain")
        if path == "/fake/stats":
            return await _respond_json(writer, 200, self.stats())
        if path == "/fake/reset":
            self.state.lateness_s.clear()
            return await _respond_json(writer, 200, {"reset": True})
        if path == "/v1/chat/completions" and method == "POST":
            return await self._chat(json.loads(body or b"{}"), received, writer)
        return await _respond_json(writer, 404, {"error": {"message": f"no route {path}"}})

    def stats(self) -> dict[str, Any]:
        late = sorted(self.state.lateness_s)

        def q(p: float) -> float | None:
            return late[min(len(late) - 1, int(p * len(late)))] if late else None

        return {"requests": self.state.requests, "events": len(late),
                "lateness_p50_s": q(0.5), "lateness_p99_s": q(0.99),
                "lateness_max_s": late[-1] if late else None}

    def _metrics(self) -> str:
        s = self.state
        return "\n".join([
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="target"}} {float(s.running)}',
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{model_name="target"} 0.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="target"}} {min(1.0, s.running / 64)}',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="target"}} {float(s.prompt_tokens)}',
            "# TYPE vllm:prefix_cache_hits counter",
            'vllm:prefix_cache_hits_total{model_name="target"} 0.0',
            "# TYPE vllm:num_preemptions counter",
            'vllm:num_preemptions_total{model_name="target"} 0.0',
            "# TYPE vllm:request_queue_time_seconds histogram",
            'vllm:request_queue_time_seconds_sum{model_name="target"} 0.0',
            f'vllm:request_queue_time_seconds_count{{model_name="target"}} {float(s.requests)}',
            "",
        ])

    async def _chat(self, body: dict[str, Any], received: float,
                    writer: asyncio.StreamWriter) -> bool:
        fake = body.get("fake") or {}
        if fake.get("status"):
            return await _respond_json(writer, int(fake["status"]),
                                       {"error": {"message": "injected failure"}})
        cfg = self.config
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or cfg.tokens)
        ttft = float(fake.get("ttft_ms", cfg.ttft_ms)) / 1000
        itl = float(fake.get("itl_ms", cfg.itl_ms)) / 1000
        fail_after = fake.get("fail_after_tokens")
        prompt = max(1, len(json.dumps(body.get("messages") or [])) // 4)
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens,
                 "total_tokens": prompt + tokens,
                 "prompt_tokens_details": {"cached_tokens": min(cfg.cached_tokens, prompt)}}
        rid, model = f"chatcmpl-{uuid.uuid4().hex[:16]}", body.get("model", cfg.models[0])
        self.state.requests += 1
        self.state.prompt_tokens += prompt
        self.state.running += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(max(0.0, received + ttft + (tokens - 1) * itl
                                        - asyncio.get_running_loop().time()))
                message = {"role": "assistant", "content": "tok " * tokens}
                return await _respond_json(writer, 200, {
                    "id": rid, "object": "chat.completion", "created": int(time.time()),
                    "model": model, "usage": usage, "choices": [
                        {"index": 0, "message": message, "finish_reason": "length"}]})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
            await writer.drain()
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(writer, rid, model, tokens, received + ttft, itl,
                                      fail_after, usage if include_usage else None)
        finally:
            self.state.running -= 1

    async def _stream(self, writer: asyncio.StreamWriter, rid: str, model: str, tokens: int,
                      first: float, itl: float, fail_after: Any,
                      usage: dict[str, Any] | None) -> bool:
        loop = asyncio.get_running_loop()
        head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model}
        for i in range(tokens):
            if fail_after is not None and i >= int(fail_after):
                writer.transport.abort()  # close mid-stream, no terminating chunk
                return False
            due = first + i * itl
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            delta: dict[str, Any] = {"content": "tok "}
            if i == 0:
                delta["role"] = "assistant"
            finish = "length" if i == tokens - 1 else None
            event = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            _write_event(writer, event)
            self.state.lateness_s.append(loop.time() - due)
            await writer.drain()
        if usage is not None:
            _write_event(writer, {**head, "choices": [], "usage": usage})
        _write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _write_event(writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
    _write_chunk(writer, b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")


async def _respond(writer: asyncio.StreamWriter, status: int, data: bytes,
                   content_type: str) -> bool:
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                 f"content-length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return True


async def _respond_json(writer: asyncio.StreamWriter, status: int, value: Any) -> bool:
    return await _respond(writer, status, json.dumps(value).encode(), "application/json")


class FakeProcess:
    """The fake server in a subprocess of its own (so its timing does not share our GIL).

    `with FakeProcess(FakeConfig(ttft_ms=200)) as fake: fake.api_url` -> `http://.../v1`.
    """

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def start(self) -> FakeProcess:
        c = self.config
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loadgen.fakeserver", "--host", c.host, "--port", str(c.port),
             "--ttft-ms", str(c.ttft_ms), "--itl-ms", str(c.itl_ms), "--tokens", str(c.tokens),
             "--cached-tokens", str(c.cached_tokens)],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"fake server did not start (said {line!r})")
        self.port = int(line.split()[-1])
        return self

    def stats(self, *, reset: bool = False) -> dict[str, Any]:
        """The server's own lateness so far (optionally clearing it after reading)."""
        with urllib.request.urlopen(self.base_url + "/fake/stats", timeout=10) as response:
            value: dict[str, Any] = json.loads(response.read())
        if reset:
            urllib.request.urlopen(self.base_url + "/fake/reset", timeout=10).close()
        return value

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> FakeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _main(config: FakeConfig) -> None:
    server = FakeServer(config)
    port = await server.start()
    print(f"listening on {port}", flush=True)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server with known "
                                     "time-to-first-token and inter-token gaps.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=64,
                        help="tokens per reply when the request sets no max_tokens")
    parser.add_argument("--cached-tokens", type=int, default=0,
                        help="cached tokens reported per request (capped at the prompt)")
    args = parser.parse_args(argv)
    config = FakeConfig(host=args.host, port=args.port, ttft_ms=args.ttft_ms,
                        itl_ms=args.itl_ms, tokens=args.tokens, cached_tokens=args.cached_tokens)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(config))


if __name__ == "__main__":
    main()
