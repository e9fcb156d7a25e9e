"""Against the real vLLM CPU server with the embedded model (no fakes)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from openai import NotFoundError, OpenAI

from compaction_bench.common.net import free_port
from compaction_bench.common.paths import repo_root
from compaction_bench.common.processtree import group_members
from compaction_bench.serve.errors import ServerStartError
from compaction_bench.serve.launcher import Server, ServerConfig, start_server
from compaction_bench.serve.profile import load_profile

pytestmark = pytest.mark.integration

# About 2,700 tokens: well past vLLM's KV block size, so a repeat must hit the prefix cache.
LONG_PREFIX = " ".join(f"Record {i}: sensor {i % 17} read {i * 7} units." for i in range(150))


def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)


def test_both_served_names_answer_from_one_engine(cpu_server: Server) -> None:
    models = {m.id for m in client(cpu_server).models.list()}
    assert models == {"target", "compressor"}
    for name in ("target", "compressor"):
        reply = client(cpu_server).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
        # vLLM reports the first served name in `model`; what matters is that each name is
        # accepted and answered (an unknown name gets 404 below).
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    with pytest.raises(NotFoundError):
        client(cpu_server).chat.completions.create(
            model="not-served", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def _cached(server: Server, model: str, stream: bool) -> int:
    messages = [{"role": "system", "content": LONG_PREFIX},
                {"role": "user", "content": "What did sensor 3 read last?"}]
    c = client(server)
    if not stream:
        reply = c.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                          max_tokens=4)
        usage = reply.usage
    else:
        chunks = list(c.chat.completions.create(
            model=model, messages=messages, max_tokens=4, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}))
        usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 2000
    assert usage.prompt_tokens_details is not None
    return int(usage.prompt_tokens_details.cached_tokens or 0)


def test_repeated_long_prefix_reports_cached_tokens(cpu_server: Server) -> None:
    _cached(cpu_server, "target", stream=False)
    assert _cached(cpu_server, "target", stream=False) > 1000
    # The compressor alias shares the engine, hence the cache; streaming reports it in the
    # final usage chunk.
    assert _cached(cpu_server, "compressor", stream=True) > 1000


def _metric(text: str, name: str) -> float:
    values = [float(m.group(1)) for m in re.finditer(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)]
    assert values, f"{name} missing from /metrics"
    return sum(values)


def test_metrics_expose_prefix_cache_counters(cpu_server: Server) -> None:
    _cached(cpu_server, "target", stream=False)
    text = httpx.get(f"{cpu_server.server_url}/metrics", timeout=10).text
    queries = _metric(text, "vllm:prefix_cache_queries_total")
    hits = _metric(text, "vllm:prefix_cache_hits_total")
    assert queries > 0 and 0 < hits <= queries
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc"):
        _metric(text, gauge)


def test_server_binds_loopback_only(cpu_server: Server) -> None:
    port = cpu_server.config.port
    listening = [c for c in psutil.net_connections(kind="inet")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert listening and {c.laddr.ip for c in listening} == {"127.0.0.1"}


def test_server_that_dies_while_starting_quotes_its_log(tmp_path: Path) -> None:
    bad = (repo_root() / "serve/profiles/cpu-tiny.toml").read_text().replace(
        'dtype = "bfloat16"', 'dtype = "bfloat16"\nextra_args = ["--no-such-engine-flag"]')
    (tmp_path / "broken.toml").write_text(bad.replace('name = "cpu-tiny"', 'name = "broken"'))
    config = ServerConfig(profile=load_profile(str(tmp_path / "broken.toml")), port=free_port(),
                          log_path=tmp_path / "broken.log", ready_timeout_s=300)
    with pytest.raises(ServerStartError) as err:
        start_server(config)
    message = str(err.value)
    assert "exited with code" in message and "broken.log" in message
    assert "--no-such-engine-flag" in message  # vLLM's own complaint, quoted from the log


def test_foreground_serve_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    """`make serve` path: log on the terminal, API key enforced, Ctrl-C leaves nothing behind
    and frees its port. Its cold start overlaps the session server's; the background path
    (`serve --background`, `stop`) is the session server's own, tested last."""
    port = free_port()
    proc: subprocess.Popen[str] | None = None
    try:
        env = {**os.environ, "API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "compaction_bench", "serve", "--profile", "cpu-tiny",
             "--port", str(port),
             "--fast-start"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            # a background job of a non-interactive shell (CI, nohup) starts with SIGINT ignored,
            # and Python then installs no Ctrl-C handler: give the child a terminal's default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout is not None
        log = []
        deadline = time.monotonic() + 600
        for line in proc.stdout:
            log.append(line)
            if "== serving" in line or time.monotonic() > deadline:
                break
        assert any("== serving target, compressor" in line for line in log), "".join(log[-20:])
        # `make serve` prints the self-check's result once the server is up, before the banner
        assert any("== self-check of" in line and "): passed in" in line for line in log), \
            "".join(log[-20:])
        assert any("Application startup complete" in line for line in log)  # vLLM's log, echoed
        base = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(base, timeout=10).status_code == 401
        assert httpx.get(base, headers={"Authorization": "Bearer test-key"},
                         timeout=10).status_code == 200
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert len(tree) >= 3  # our CLI, the API server, vLLM's engine core
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
        _assert_gone(tree)
        assert not _listeners(port), f"port {port} still listened on by {_listeners(port)}"
        with socket.socket() as again:  # the port is free again: nothing holds it after Ctrl-C
            # as a server binds (uvicorn, vLLM): the test's own closed connections may sit in
            # TIME_WAIT on this port, which refuses a plain bind (CI, 2026-12-06: EADDRINUSE
            # with every process gone) but never a server's; a listener still refuses it
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
    finally:  # a failure above leaves no server, and no open pipe, behind for the rest of
        # the tier (an unclosed pipe's ResourceWarning fails whichever later test GC meets it in)
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    for process in psutil.Process(proc.pid).children(recursive=True):
                        process.kill()
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait(timeout=60)


def test_the_background_session_server_stops_with_stop(
        session_server_to_stop: tuple[Server, str]) -> None:
    """`serve --background` started the session server (tests/conftest.py): it returned once
    healthy and self-checked, naming its pid. `stop --port` ends that whole process tree. The
    tier's last test: collection puts it after every test that uses the server."""
    server, started = session_server_to_stop
    port = server.config.port
    assert f"serving target, compressor at {server.api_url}" in started, started
    pid = int(re.search(r"pid (\d+)", started).group(1))  # type: ignore[union-attr]
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert len(tree) >= 2, tree  # the API server and vLLM's engine core
    assert httpx.get(f"{server.server_url}/health", timeout=10).status_code == 200
    stopped = subprocess.run([sys.executable, "-m", "compaction_bench", "stop",
                              "--port", str(port)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert f"stopped server on port {port}" in stopped.stdout, stopped.stdout + stopped.stderr
    _assert_gone(tree)
    assert not group_members(pid)
    assert not _listeners(port), f"port {port} still listened on by {_listeners(port)}"


def _listeners(port: int) -> list[str]:
    """The processes with a socket listening on `port`, by pid."""
    return [f"pid {c.pid}" for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]


def _assert_gone(tree: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.5)
    raise AssertionError(f"processes left after stop: {[p.pid for p in alive]}")
