"""The one fake OpenAI-compatible server: timing known exactly, replies scripted, faults injected.

It exists where the truth must be known exactly (DESIGN: the one allowed fake): client timing
accuracy, fault handling, and the rules of the agent loop and the compactor. Every streamed
response puts its first token at `sent + ttft` and token i at `sent + ttft + i * itl` on the
event loop's monotonic clock, where `sent` is when the request's body was fully read. Events are
scheduled on absolute times, so a late wake-up never shifts later tokens; how late the server
itself wrote each event is kept and served at `/fake/stats`, so a client benchmark can tell
server lateness from client error.

Replies: by default `"tok "` repeated `max_tokens` (else `--tokens`) times, or the fixed
`--default-content`. A test can queue
scripted replies (`POST /fake/script` with a JSON list, `FakeProcess.script`); each request takes
the next one, which may set:

- `content`, `reasoning` (streamed word by word), `tool_calls` ([{"name", "arguments"}]),
  `finish_reason`, `usage` (merged over the computed one);
- `ttft_ms`, `itl_ms`: this reply's timing;
- faults: `status` (an HTTP error status, body `{"error": ...}`), `body` (raw bytes sent as the
  whole response body: garbage, or a non-completion), `fail_after_tokens` (close the connection
  mid-stream), `stall_after_tokens` (stop sending, keep the connection open for `stall_s`),
  `events` (raw SSE data payloads sent instead of the generated ones, e.g. `1` or
  `{"choices":[1]}`), `separator` (`"\\n\\n"`, `"\\r\\n\\r\\n"` or `"\\r\\r"`).

A scripted reply may carry `match` (`{"model": "compressor"}`, `{"request_id_prefix": "bg-"}`:
only a request that matches every key takes it; the background users' ids start with `bg-`) and
`repeat` (taken by that many requests). A request takes the first entry it matches.

A request body may also carry `"fake": {...}` with the same keys. `GET /fake/requests` returns
every request body received (with its path and Authorization header); `POST /fake/reset`
clears bodies, script and lateness. `loadgen.fakeprocess.FakeProcess` runs the server in a
subprocess and drives these. Endpoints: POST /v1/chat/completions (stream and non-stream;
`stream_options.include_usage`), GET /v1/models, /health, /version, /metrics (vllm:* gauges and
counters).

Engine mode (`--engine steps`, opt-in; the default `none` is the fixed timing above): a capacity
model with continuous batching and a prefix cache per server process, stated exactly in
`loadgen.fakeengine` (the truth a fleet's capacity is computed from). Its flags: `--max-running C`
(slots, vLLM's max_num_seqs; 0: no limit), `--prefill-ms-per-token P` (an uncached prompt
token), `--cache-discount D` in [0, 1] (a cached prompt token costs (1 - D) * P), `--step-ms S`
and `--step-ms-per-seq Q` (a decode step of B sequences costs S + Q * B), `--block-tokens K`
(cache block, default 16), `--cache-tokens T` (LRU capacity, 0: unlimited). A reply streams its
first token in one chunk at the end of its prefill, then the rest in at most one chunk per 50 ms
of engine time and a last one; completion tokens are exactly those asked for (max_tokens,
max_completion_tokens, else `--tokens`, or the scripted reply's words), and usage carries the
cached tokens. /metrics then reports the engine's running and waiting requests, the prefix
cache's queried and hit tokens, and `vllm:cache_config_info` (block_size K, num_gpu_blocks T // K
or 10**9 when unlimited); `/fake/stats` adds the engine's counters. A reply with its own timing
(`ttft_ms`, `itl_ms`) or a stream fault (`events`, `fail_after_tokens`, `stall_after_tokens`)
bypasses the engine and keeps the fixed timing; `status` and `body` answer at once.

    python -m compaction_bench.loadgen.fakeserver --port 8100 --ttft-ms 200 --itl-ms 20 --tokens 64

With `--port 0` it prints `listening on PORT` as its first stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from compaction_bench.loadgen.fakeengine import Engine, Job, StepModel
from compaction_bench.serve.engines import vllm_wire as dialect

_WORDS = re.compile(r"\S+\s*|\s+")


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
    default_content: str | None = None  # unscripted replies: this text instead of "tok " x N
    # at most this many chat completions in service at once (vLLM's max_num_seqs; 0: no
    # limit); a later one waits, first come first served, and its timing starts when admitted,
    # so a closed-loop fleet of N agents has a known capacity (bench REGIME=search's e2e test)
    max_running: int = 0
    # engine mode (module docstring, loadgen.fakeengine): "none" (the fixed timing) or "steps"
    engine: str = "none"
    prefill_ms_per_token: float = StepModel.prefill_ms_per_token
    cache_discount: float = StepModel.cache_discount
    step_ms: float = StepModel.step_ms
    step_ms_per_seq: float = StepModel.step_ms_per_seq
    block_tokens: int = StepModel.block_tokens
    cache_tokens: int = StepModel.cache_tokens
    # every response names this model, whatever was asked: a server that answers as another
    # model than the run is configured for (a hosted name that moved to a new model)
    answer_as: str | None = None

    def __post_init__(self) -> None:
        problems = self.step_model().problems()
        if self.engine not in ("none", "steps"):
            problems.insert(0, f"--engine {self.engine}: must be none (fixed timing) or steps "
                            "(the capacity model)")
        if problems:
            raise ValueError("; ".join(problems))

    def step_model(self) -> StepModel:
        return StepModel(self.max_running, self.prefill_ms_per_token, self.cache_discount,
                         self.step_ms, self.step_ms_per_seq, self.block_tokens,
                         self.cache_tokens)


@dataclass
class _State:
    running: int = 0
    requests: int = 0
    finished: int = 0  # answered to the end (vllm:request_success_total)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    lateness_s: list[float] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    script: deque[dict[str, Any]] = field(default_factory=deque)


def _pieces(text: str) -> list[str]:
    return _WORDS.findall(text) if text else []


class FakeServer:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.state = _State()
        self.port = config.port
        self._server: asyncio.Server | None = None
        self._slots: asyncio.Semaphore | None = None
        self.engine = Engine(config.step_model()) if config.engine == "steps" else None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, self.config.host,
                                                  self.config.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def stop(self) -> None:
        """Stop listening (an in-process server's end; connections still open end with their
        event loop, which cancels their handlers)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.engine is not None:
            await self.engine.stop()

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
                keep = await self._route(method, target.split("?")[0], body, received, writer,
                                         headers) and keep
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _route(self, method: str, path: str, body: bytes, received: float,
                     writer: asyncio.StreamWriter, headers: dict[str, str]) -> bool:
        if path == "/health":
            return await _respond(writer, 200, b"", "text/plain")
        if path == "/version":
            return await _respond_json(writer, 200, {"version": "fake-1"})
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "owned_by": "fake",
                     "max_model_len": self.config.max_model_len} for m in self.config.models]
            return await _respond_json(writer, 200, {"object": "list", "data": data})
        if path == "/metrics":
            return await _respond(writer, 200, self._metrics().encode(), "text/plain")
        if path == "/fake/stats":
            return await _respond_json(writer, 200, self.stats())
        if path == "/fake/requests":
            return await _respond_json(writer, 200, self.state.bodies)
        if path == "/fake/script" and method == "POST":
            replies = json.loads(body or b"[]")
            self.state.script.extend(replies if isinstance(replies, list) else [replies])
            return await _respond_json(writer, 200, {"queued": len(self.state.script)})
        if path == "/fake/reset":
            self.state.lateness_s.clear()
            self.state.bodies.clear()
            self.state.script.clear()
            return await _respond_json(writer, 200, {"reset": True})
        if path == "/v1/chat/completions" and method == "POST":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                return await _respond_json(writer, 400, {"error": {"message": "bad JSON"}})
            self.state.bodies.append({"path": path, "authorization": headers.get(
                "authorization"), **request})
            if self.config.max_running <= 0 or self.engine is not None:
                return await self._chat(request, received, writer,
                                        headers.get("x-request-id", ""))
            self._slots = self._slots or asyncio.Semaphore(self.config.max_running)
            async with self._slots:  # queued: the reply's timing starts when admitted
                admitted = max(received, asyncio.get_running_loop().time())
                return await self._chat(request, admitted, writer,
                                        headers.get("x-request-id", ""))
        return await _respond_json(writer, 404, {"error": {"message": f"no route {path}"}})

    def stats(self) -> dict[str, Any]:
        late = sorted(self.state.lateness_s)

        def q(p: float) -> float | None:
            return late[min(len(late) - 1, int(p * len(late)))] if late else None

        out: dict[str, Any] = {"requests": self.state.requests, "events": len(late),
                               "lateness_p50_s": q(0.5), "lateness_p99_s": q(0.99),
                               "lateness_max_s": late[-1] if late else None}
        if self.engine is not None:
            c = self.engine.counters
            out["engine"] = {"requests": c.requests, "prefilled_tokens": c.prefilled_tokens,
                             "cached_tokens": c.cached_tokens, "steps": c.steps,
                             "running": len(self.engine.running),
                             "waiting": len(self.engine.waiting),
                             "cache_blocks": len(self.engine.cache)}
        return out

    def _metrics(self) -> str:
        s, e = self.state, self.engine
        running, waiting = float(s.running), 0.0
        queries, hits, usage = float(s.prompt_tokens), 0.0, min(1.0, s.running / 64)
        info = []
        if e is not None:
            running, waiting = float(len(e.running)), float(len(e.waiting))
            queries, hits = float(e.counters.queried_tokens), float(e.counters.cached_tokens)
            m = e.model
            usage = len(e.cache) / m.num_blocks if m.cache_tokens else 0.0
            info = ["# TYPE vllm:cache_config_info gauge",
                    f'vllm:cache_config_info{{block_size="{m.block_tokens}",'
                    f'enable_prefix_caching="True",num_gpu_blocks="{m.num_blocks}"}} 1.0']
        return "\n".join([
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="target"}} {running}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="target"}} {waiting}',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="target"}} {usage}',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="target"}} {queries}',
            "# TYPE vllm:generation_tokens counter",
            f'vllm:generation_tokens_total{{model_name="target"}} {float(s.generation_tokens)}',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{model_name="target"}} {hits}',
            "# TYPE vllm:num_preemptions counter",
            'vllm:num_preemptions_total{model_name="target"} 0.0',
            "# TYPE vllm:request_queue_time_seconds histogram",
            'vllm:request_queue_time_seconds_sum{model_name="target"} 0.0',
            f'vllm:request_queue_time_seconds_count{{model_name="target"}} {float(s.requests)}',
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{model_name="target"}} {float(s.finished)}',
            *info,
            "",
        ])

    def _reply(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        scripted = self._scripted(body, request_id)
        fake = body.get("fake") or {}
        return {**scripted, **(fake if isinstance(fake, dict) else {})}

    def _scripted(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """The first queued reply this request matches (removed once its repeats are used)."""
        for entry in self.state.script:
            match = entry.get("match") or {}
            if match.get("model") not in (None, body.get("model")) or not request_id.startswith(
                    str(match.get("request_id_prefix") or "")):
                continue
            left = int(entry.get("repeat") or 1) - 1
            if left > 0:
                entry["repeat"] = left
            else:
                self.state.script.remove(entry)
            return {k: v for k, v in entry.items() if k not in ("match", "repeat")}
        return {}

    async def _chat(self, body: dict[str, Any], received: float,
                    writer: asyncio.StreamWriter, request_id: str = "") -> bool:
        reply = self._reply(body, request_id)
        cfg = self.config
        if reply.get("status"):
            return await _respond_json(writer, int(reply["status"]),
                                       {"error": {"message": "injected failure"}})
        if reply.get("body") is not None and not body.get("stream"):
            raw = reply["body"]
            return await _respond(writer, 200, (raw if isinstance(raw, str) else json.dumps(
                raw)).encode(), "application/json")
        if not reply and cfg.default_content is not None:
            reply = {"content": cfg.default_content}
        scripted = any(k in reply for k in ("content", "reasoning", "tool_calls"))
        if scripted:
            pieces: list[tuple[str, Any]] = [
                ("reasoning", p) for p in _pieces(str(reply.get("reasoning") or ""))]
            pieces += [("content", p) for p in _pieces(str(reply.get("content") or ""))]
            calls = reply.get("tool_calls") or []
            pieces += [("tool_call", i) for i in range(len(calls))]
        else:
            tokens = int(body.get("max_completion_tokens") or body.get("max_tokens")
                         or cfg.tokens)
            pieces = [("content", "tok ")] * tokens
            calls = []
        ttft = float(reply.get("ttft_ms", cfg.ttft_ms)) / 1000
        itl = float(reply.get("itl_ms", cfg.itl_ms)) / 1000
        prompt = max(1, len(json.dumps(body.get("messages") or [])) // 4)
        usage = {"prompt_tokens": prompt, "completion_tokens": max(1, len(pieces)),
                 "total_tokens": prompt + len(pieces),
                 "prompt_tokens_details": {"cached_tokens": min(cfg.cached_tokens, prompt)},
                 **(reply.get("usage") or {})}
        finish = reply.get("finish_reason") or ("tool_calls" if calls else
                                                "stop" if scripted else "length")
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        model = cfg.answer_as or body.get("model", cfg.models[0])
        self.state.requests += 1
        self.state.prompt_tokens += prompt
        self.state.running += 1
        try:
            if self.engine is not None and not _BYPASS_ENGINE.intersection(reply):
                job = self.engine.job(received, json.dumps(body.get("messages") or []), prompt,
                                      len(pieces), body.get(dialect.CACHE_SALT))
                return await self._engine_chat(job, body, writer, Reply(
                    rid, model, pieces, calls, finish, reply.get("usage") or {},
                    str(reply.get("separator") or "\n\n").encode()))
            if not body.get("stream"):
                await asyncio.sleep(max(0.0, received + ttft + max(0, len(pieces) - 1) * itl
                                        - asyncio.get_running_loop().time()))
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": "".join(p for k, p in pieces if k == "content")}
                if reply.get("reasoning"):
                    message["reasoning"] = reply["reasoning"]
                if calls:
                    message["tool_calls"] = [_call(c, i) for i, c in enumerate(calls)]
                return await _respond_json(writer, 200, {
                    "id": rid, "object": "chat.completion", "created": int(time.time()),
                    "model": model, "usage": usage, "choices": [
                        {"index": 0, "message": message, "finish_reason": finish}]})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
            await writer.drain()
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(writer, rid, model, pieces, calls, received + ttft, itl,
                                      reply, finish, usage if include_usage else None)
        finally:
            self.state.running -= 1
            self.state.finished += 1

    async def _engine_chat(self, job: Job, body: dict[str, Any], writer: asyncio.StreamWriter,
                           r: Reply) -> bool:
        """Serve a reply whose timing is the engine's (module docstring, engine mode)."""
        assert self.engine is not None
        loop = asyncio.get_running_loop()
        self.engine.submit(job)
        try:
            if not body.get("stream"):
                while not job.done:
                    await job.changed.wait()
                    job.changed.clear()
                return await _respond_json(writer, 200, {
                    "id": r.rid, "object": "chat.completion", "created": int(time.time()),
                    "model": r.model, "usage": r.exact_usage(job), "choices": [
                        {"index": 0, "message": _message(r.pieces, r.calls),
                         "finish_reason": r.finish}]})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n")
            await writer.drain()
            head = {"id": r.rid, "object": "chat.completion.chunk",
                    "created": int(time.time()), "model": r.model}
            sent = 0
            while sent < job.tokens:
                await job.changed.wait()
                job.changed.clear()
                # the first chunk holds the first token alone, later ones all made so far
                upto = 1 if sent == 0 else min(job.generated, job.tokens)
                if upto <= sent:
                    continue
                delta = _delta(r.pieces[sent:upto], r.calls, sent)
                done = r.finish if upto == job.tokens else None
                _write_event(writer, {**head, "choices": [
                    {"index": 0, "delta": delta, "finish_reason": done}]}, r.separator)
                self.state.generation_tokens += upto - sent
                self.state.lateness_s.append(loop.time() - job.notified_at)
                sent = upto
                if sent == 1 and job.done:
                    job.changed.set()  # the last token's notice came with the first's
                await writer.drain()
            if (body.get("stream_options") or {}).get("include_usage"):
                _write_event(writer, {**head, "choices": [], "usage": r.exact_usage(job)},
                             r.separator)
            _write_chunk(writer, b"data: [DONE]" + r.separator)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            if not job.done:
                self.engine.abort(job)

    async def _stream(self, writer: asyncio.StreamWriter, rid: str, model: str,
                      pieces: list[tuple[str, Any]], calls: list[dict[str, Any]], first: float,
                      itl: float, reply: dict[str, Any], finish: str,
                      usage: dict[str, Any] | None) -> bool:
        loop = asyncio.get_running_loop()
        sep = str(reply.get("separator") or "\n\n").encode()
        head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model}
        fail_after, stall_after = reply.get("fail_after_tokens"), reply.get("stall_after_tokens")
        raw_events = reply.get("events")
        if raw_events is not None:
            for i, raw in enumerate(raw_events):
                await _sleep_until(loop, first + i * itl)
                _write_chunk(writer, b"data: " + str(raw).encode() + sep)
                await writer.drain()
            _write_chunk(writer, b"data: [DONE]" + sep)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        for i, (kind, value) in enumerate(pieces):
            if fail_after is not None and i >= int(fail_after):
                writer.transport.abort()  # close mid-stream, no terminating chunk
                return False
            if stall_after is not None and i >= int(stall_after):
                await asyncio.sleep(float(reply.get("stall_s", 3600)))
                writer.transport.abort()
                return False
            due = first + i * itl
            await _sleep_until(loop, due)
            delta: dict[str, Any]
            if kind == "tool_call":
                delta = {"tool_calls": [{**_call(calls[value], value), "index": value}]}
            else:
                delta = {kind: value}
            if i == 0:
                delta["role"] = "assistant"
            done = finish if i == len(pieces) - 1 else None
            event = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": done}]}
            _write_event(writer, event, sep)
            self.state.generation_tokens += 1
            self.state.lateness_s.append(loop.time() - due)
            await writer.drain()
        if usage is not None:
            _write_event(writer, {**head, "choices": [], "usage": usage}, sep)
        _write_chunk(writer, b"data: [DONE]" + sep)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


# a reply with any of these keeps the fixed timing in engine mode (module docstring)
_BYPASS_ENGINE = frozenset({"ttft_ms", "itl_ms", "events", "fail_after_tokens",
                            "stall_after_tokens"})


@dataclass(frozen=True)
class Reply:
    """What the engine path sends for one request, but its timing."""

    rid: str
    model: str
    pieces: list[tuple[str, Any]]
    calls: list[dict[str, Any]]
    finish: str
    usage: dict[str, Any]  # the scripted reply's, merged over the engine's
    separator: bytes

    def exact_usage(self, job: Job) -> dict[str, Any]:
        """The engine's token counts (a scripted `usage` still wins)."""
        return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.tokens,
                "total_tokens": job.prompt_tokens + job.tokens,
                **self.usage, "prompt_tokens_details": {"cached_tokens": job.cached_tokens,
                                                        **self.usage.get(
                                                            "prompt_tokens_details", {})}}


def _message(pieces: list[tuple[str, Any]], calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(
        p for k, p in pieces if k == "content")}
    reasoning = "".join(p for k, p in pieces if k == "reasoning")
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [_call(c, i) for i, c in enumerate(calls)]
    return message


def _delta(pieces: list[tuple[str, Any]], calls: list[dict[str, Any]],
           start: int) -> dict[str, Any]:
    """One chunk's delta for several pieces: their reasoning, content and tool calls joined."""
    delta: dict[str, Any] = {"role": "assistant"} if start == 0 else {}
    for kind in ("reasoning", "content"):
        text = "".join(p for k, p in pieces if k == kind)
        if text or (kind == "content" and not pieces):
            delta[kind] = text
    tools = [{**_call(calls[i], i), "index": i} for k, i in pieces if k == "tool_call"]
    if tools:
        delta["tool_calls"] = tools
    return delta


def _call(call: dict[str, Any], index: int) -> dict[str, Any]:
    arguments = call.get("arguments", {})
    return {"id": call.get("id") or f"call_{index}_{uuid.uuid4().hex[:6]}", "type": "function",
            "function": {"name": call.get("name", ""),
                         "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)}}


async def _sleep_until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    delay = due - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _write_event(writer: asyncio.StreamWriter, event: dict[str, Any], sep: bytes) -> None:
    _write_chunk(writer, b"data: " + json.dumps(event, separators=(",", ":")).encode() + sep)


async def _respond(writer: asyncio.StreamWriter, status: int, data: bytes,
                   content_type: str) -> bool:
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                 f"content-length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return True


async def _respond_json(writer: asyncio.StreamWriter, status: int, value: Any) -> bool:
    return await _respond(writer, status, json.dumps(value).encode(), "application/json")


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
    parser.add_argument("--default-content", default=None,
                        help="text of unscripted replies (default: 'tok ' repeated)")
    parser.add_argument("--max-running", type=int, default=0,
                        help="chat completions in service at once; later ones queue (0: no "
                        "limit); in engine mode the engine's slots (max_num_seqs)")
    engine = parser.add_argument_group("engine mode (--engine steps; see loadgen.fakeengine; "
                                       "the defaults are the fake-fleet profile's)")
    engine.add_argument("--engine", default="none", help="none: fixed timing (default); "
                        "steps: prefill and decode steps with a prefix cache")
    engine.add_argument("--prefill-ms-per-token", type=float, metavar="P",
                        default=StepModel.prefill_ms_per_token,
                        help="prefill cost of an uncached prompt token (ms)")
    engine.add_argument("--cache-discount", type=float, metavar="D",
                        default=StepModel.cache_discount,
                        help="in [0, 1]: a cached prompt token costs (1 - D) * P (1: free)")
    engine.add_argument("--step-ms", type=float, metavar="S",
                        default=StepModel.step_ms,
                        help="a decode step's base cost (ms): a step of B sequences is S + Q*B")
    engine.add_argument("--step-ms-per-seq", type=float, metavar="Q",
                        default=StepModel.step_ms_per_seq,
                        help="a decode step's cost per running sequence (ms)")
    engine.add_argument("--block-tokens", type=int, metavar="K",
                        default=StepModel.block_tokens,
                        help="prefix-cache block in tokens (4 characters of prompt a token)")
    engine.add_argument("--cache-tokens", type=int, metavar="T",
                        default=StepModel.cache_tokens,
                        help="prefix-cache capacity in tokens, LRU (0: unlimited)")
    parser.add_argument("--answer-as", default=None, metavar="MODEL",
                        help="every response names this model (a server answering as another)")
    args = parser.parse_args(argv)
    try:
        config = FakeConfig(
            host=args.host, port=args.port, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
            tokens=args.tokens, cached_tokens=args.cached_tokens,
            default_content=args.default_content, max_running=args.max_running,
            engine=args.engine, prefill_ms_per_token=args.prefill_ms_per_token,
            cache_discount=args.cache_discount, step_ms=args.step_ms,
            step_ms_per_seq=args.step_ms_per_seq, block_tokens=args.block_tokens,
            cache_tokens=args.cache_tokens, answer_as=args.answer_as)
    except ValueError as err:
        parser.exit(2, f"fakeserver: error: {err}\n")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(config))


if __name__ == "__main__":
    main()
