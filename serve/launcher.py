"""Start, watch and stop a vLLM OpenAI-compatible server for a profile.

The server runs in a process group of its own, so stopping it (`common.processtree`) stops
vLLM's engine processes too. A background server leaves a pid file so `make stop` can find it from
another shell. Readiness is `/health` answering 200 (`serve.endpoints`); a server that dies
first raises an error quoting the end of its log.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from compaction_bench.common.files import append_jsonl
from compaction_bench.common.interrupt import interrupt_on
from compaction_bench.common.net import api_url, server_url
from compaction_bench.common.paths import run_state_dir
from compaction_bench.common.processtree import stop_tree
from compaction_bench.serve.command import (
    ServerConfig,
    build_command,
    build_env,
)
from compaction_bench.serve.endpoints import ServerEndpoints, is_healthy
from compaction_bench.serve.engines.registry import engine_of
from compaction_bench.serve.errors import (
    PortInUseError,
    ServerStartError,
    ServerUnreachableError,
)
from compaction_bench.serve.model import resolve_model
from compaction_bench.serve.process import pid_file, rotate_log, tail, write_pid_file
from compaction_bench.serve.profile import Profile
from compaction_bench.serve.share import host_share, make_cgroup, remove_cgroup

# ServerConfig and build_command (serve.command) are used with the launcher
__all__ = ["LazyServer", "Server", "ServerConfig", "build_command", "check_engine", "check_port",
           "require_server", "serve_foreground", "server_for", "start_server"]


def check_engine(profile: Profile) -> str | None:
    """Fail early, and clearly, where this machine cannot run the profile's engine; return a
    note worth saying (another vLLM minor version than the profile was checked with)."""
    return engine_of(profile).check(profile)


def check_port(host: str, port: int) -> None:
    """Raise `PortInUseError` naming the holder when host:port cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As uvicorn binds: connections left in TIME_WAIT by a server that just died must not
        # count as "in use"; a live listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            holder = _port_holder(port)
            raise PortInUseError(
                f"port {port} on {host} is already in use{holder} ({exc.strerror}); stop that "
                f"server (`make stop PORT={port}`) or choose another port, e.g. PORT={port + 1}"
            ) from None


def _port_holder(port: int) -> str:
    try:
        for conn in psutil.net_connections(kind="inet"):
            listening = conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN
            if listening and conn.pid:
                cmd = " ".join(psutil.Process(conn.pid).cmdline()[:4])
                return f" by pid {conn.pid} ({cmd})"
    except (psutil.Error, OSError):
        pass
    return ""


class Server:
    """One vLLM server process group. Use `start_server` or `with Server(cfg) as s:`."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.log_path = config.log_path or run_state_dir() / f"server-{config.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []
        self.started_monotonic: float | None = None
        self.ready_s: float | None = None  # seconds from spawn to /health 200
        self._log: IO[bytes] | None = None
        self._pump: threading.Thread | None = None
        self.cgroup: Path | None = None  # its quota's cgroup (REPLICA_CPU_QUOTA), while it runs

    @property
    def server_url(self) -> str:
        return self.config.server_url

    @property
    def api_url(self) -> str:
        return self.config.api_url

    @property
    def pid_file(self) -> Path:
        return pid_file(self.config.port)

    def start(self, *, echo: bool = False) -> None:
        """Spawn the server; with `echo`, copy its log to this terminal as well."""
        note = check_engine(self.config.profile)
        check_port(self.config.host, self.config.port)  # a refusal stays the one line it is
        if note:
            print(note, file=sys.stderr, flush=True)
        model = "fake" if self.config.profile.engine == "fake" else resolve_model(
            self.config.model or self.config.profile.model.source, python=self.config.python,
            revision=None if self.config.model else self.config.profile.model.revision)
        self.command = build_command(self.config, model)
        if self.config.cpu_quota is not None:  # refused here, before the old log is rotated
            self.cgroup = make_cgroup(self.config.port, self.config.cpu_quota)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_log(self.log_path)
        self._log = self.log_path.open("wb")
        self.started_monotonic = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.command,
                stdout=subprocess.PIPE if echo else self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=build_env(self.config),
                start_new_session=True,  # its own process group: stop() takes every child
            )
        except BaseException:
            self._cleanup()
            raise
        if echo:
            self._pump = threading.Thread(target=self._copy_output, daemon=True)
            self._pump.start()
        write_pid_file(self.config.port, {
            "pid": self.process.pid, "pgid": self.process.pid, "host": self.config.host,
            "port": self.config.port, "profile": self.config.profile.name,
            "log": str(self.log_path), "started": time.time(),
            "host_share": host_share(self.config.cpus, self.config.cpu_quota, self.cgroup),
            "cgroup": str(self.cgroup) if self.cgroup else None})

    def _copy_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        assert self._log is not None
        for line in self.process.stdout:
            self._log.write(line)
            self._log.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until `/health` answers 200; raise `ServerStartError` if the server dies or the
        timeout passes (the server is stopped in both cases)."""
        assert self.process is not None, "start() first"
        timeout = timeout_s if timeout_s is not None else (
            self.config.ready_timeout_s or self.config.profile.ready_timeout_s)
        deadline = time.monotonic() + timeout
        with ServerEndpoints(self.server_url, timeout_s=2.0) as server:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    self._flush_log()
                    self._cleanup()
                    raise ServerStartError(
                        f"vLLM server for profile '{self.config.profile.name}' exited with code "
                        f"{code} while starting (log {self.log_path}); its last lines:\n"
                        f"{tail(self.log_path)}"
                    )
                if server.healthy():
                    if self.started_monotonic is not None:
                        self.ready_s = time.monotonic() - self.started_monotonic
                    return
                time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"vLLM server for profile '{self.config.profile.name}' did not answer "
            f"{self.server_url}/health within {timeout:.0f} s (log {self.log_path}); its last "
            f"lines:\n{tail(self.log_path)}"
        )

    def _flush_log(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the whole process tree: SIGTERM, then SIGKILL after `timeout_s`. Idempotent."""
        if self.process is None:
            return
        stop_tree(self.process, grace_s=timeout_s)
        self._cleanup()

    def _cleanup(self) -> None:
        self._flush_log()
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        if self.cgroup is not None and remove_cgroup(self.cgroup):
            self.cgroup = None

    def __enter__(self) -> Server:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_server(config: ServerConfig) -> Server:
    """Start a server in the background and return it once healthy (library use)."""
    server = Server(config)
    server.start()
    server.wait_ready()
    return server


def serve_foreground(config: ServerConfig, *, after_ready: object = None) -> int:
    """`make serve`: log on the terminal; Ctrl-C, SIGTERM or SIGHUP stops the server and its
    children. Returns the exit code for the CLI.

    `after_ready`, where given, is called with the healthy server before the banner (the
    serve-time self-check); an exception from it stops the server and propagates.
    """
    server = Server(config)
    with interrupt_on(signal.SIGTERM, signal.SIGHUP):
        try:
            server.start(echo=True)
            server.wait_ready()
            if callable(after_ready):
                after_ready(server)
            names = ", ".join(config.profile.model.served_names)
            print(
                f"\n== serving {names} at {server.api_url} (profile {config.profile.name}); "
                "Ctrl-C or `make stop` stops it ==",
                flush=True,
            )
            assert server.process is not None
            code = server.process.wait()
            server._cleanup()
            print(f"== server exited with code {code} ==", file=sys.stderr)
            return 0 if code in (0, -signal.SIGTERM) else 1
        except KeyboardInterrupt:
            print("\n== stopping the server ==", file=sys.stderr, flush=True)
            server.stop()
            return 0
        except BaseException:
            server.stop()
            raise


class LazyServer:
    """A helper server (the embedded external compressor) started the first time something
    needs it, not before: `ensure()` is thread-safe, uses a server already healthy on the port,
    and starts one otherwise. Every start and stop is appended to `events` (JSONL, run clock),
    so a run records whether and when its helpers started and how long they took."""

    def __init__(self, config: ServerConfig, *, name: str, events: Path | None = None,
                 origin: float = 0.0) -> None:
        self.config = config
        self.name = name
        self.events = events
        self.origin = origin
        self.server: Server | None = None
        self.used = False
        self._lock = threading.Lock()

    def _event(self, event: str, **fields: object) -> None:
        if self.events is not None:
            append_jsonl(self.events, {"helper": self.name, "event": event,
                                       "t_s": time.monotonic() - self.origin,
                                       "url": self.config.api_url, **fields})

    def ensure(self) -> None:
        with self._lock:
            if self.used:
                return
            self.used = True
            if is_healthy(self.config.server_url):
                self._event("reused")
                return
            self._event("starting")
            server = Server(self.config)
            server.start()
            try:
                server.wait_ready()
            except BaseException:
                server.stop()
                raise
            self.server = server
            self._event("ready", ready_s=server.ready_s)

    def stop(self) -> None:
        with self._lock:
            if self.server is not None:
                self.server.stop()
                self._event("stopped")
                self.server = None
            elif not self.used:
                self._event("not-started", why="no block needed it")


def require_server(url: str) -> None:
    """Raise `ServerUnreachableError` unless the server at `url` answers `/health` or
    `/v1/models` (servers other than vLLM may lack /health)."""
    with ServerEndpoints(url, timeout_s=5.0) as server:
        if server.healthy() or server.models() is not None:
            return
    raise ServerUnreachableError(
        f"no server answers at {server_url(url)} (/health and /v1/models); start one with "
        "`make serve`, or check BASE_URL")


@contextlib.contextmanager
def server_for(config: ServerConfig, url: str | None = None) -> Iterator[str]:
    """Yield the api_url (`/v1`) of a server to use: `url` when given (either form; it must
    answer), the server already healthy on the configured port, or a new one for the profile,
    stopped on exit."""
    if url:
        require_server(url)
        yield api_url(url)
        return
    if is_healthy(config.server_url):
        yield config.api_url
        return
    expect = {"fake": "the suite's fake engine: a second",
              "cpu": "vLLM's CPU engine: a minute or two on 2 cores",
              "cuda": "weights and compilation: minutes"}[config.profile.engine]
    print(f"starting a {config.profile.name} server on port {config.port} ({expect})...",
          file=sys.stderr, flush=True)
    with Server(config) as server:
        yield server.api_url
