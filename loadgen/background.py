"""Start and stop the background load from the bench (a normal process; never imports locust).

    config = BackgroundConfig(server_url="http://127.0.0.1:8000", users=8, regime="overloaded",
                              out=run_dir / "requests.jsonl", origin=run_start, workers=0)
    with BackgroundLoad(config) as load:      # start()
        load.wait_steady(timeout_s=120)       # every user has sent its first request
        load.set_block(3)                     # background records now carry block 3
        ...                                   # the arms of the block
    # stop(): SIGTERM to the process tree, SIGKILL after a grace period

The locust processes run in a process group of their own, stop by themselves after
`duration_s`, and stop when this process dies; `stop()` (also registered with `atexit`) kills
the whole group, so none outlives the bench.

`BackgroundConfig` (typed, no locust import) travels to the locust processes as a JSON file;
everything they need is in it. With workers (`workers` local, `remote_workers` started on other
hosts by `compaction-bench load worker`), the master hands it on to each worker, every worker
writes its own raw records, and `stop()` merges the local workers' into `out`, refusing a record
lost or duplicated (`loadgen/merge.py`; docs/load.md).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.errors import UnavailableError
from compaction_bench.common.files import append_jsonl, write_text_atomic
from compaction_bench.common.net import api_url
from compaction_bench.common.paths import histories_root
from compaction_bench.common.processtree import stop_tree
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.client import send_once
from compaction_bench.transport.wire import ReplayOptions


def default_history_paths(root: str | Path) -> list[Path]:
    """The study's six real histories (`<root>/study/*/clean.json`), sorted: realistic agent
    traffic (DeepSeek V4 Flash and Laguna, native reasoning) that is none of the experimental
    task's arms, so the background never warms exactly the clean arm's prefix."""
    return sorted(Path(root).glob("study/*/clean.json"))


def _default_histories() -> list[Path]:
    return default_history_paths(histories_root())


class BackgroundConfig(BaseModel):
    """One background load: `users` replaying `histories` against `server_url` until stopped.

    Paths may be relative (resolved when the load starts). Unset: `histories` = the shipped
    study histories plus any `histories/<task>/clean.json`; `state_dir` = `<out's folder>/
    background`; `block_file` = `<state_dir>/block`; `workers_dir` = `<state_dir>/workers/
    <start time>-<pid>`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    server_url: str  # the server, with or without the /v1 suffix (normalized by `api_url`)
    model: str = "target"
    users: int = Field(gt=0)
    regime: str = "shared"
    out: Path  # requests.jsonl to append to
    origin: float = 0.0  # time.monotonic() value the records count from (the run's start)
    spawn_rate: float = Field(default=1.0, gt=0)  # planned starts per second: user i at i/rate
    # None: the load lives until `stop()` (or until the process that started it dies), exactly
    # as long as the run; a number: it also stops itself after that many seconds.
    duration_s: float | None = Field(default=None, gt=0)
    workers: int = Field(default=0, ge=0)  # 0: one local locust process; N: master+N workers
    # Workers started elsewhere (`compaction-bench load worker master=HOST:PORT`), waited for
    # beside the N local ones; with any, the master listens on master_host:master_port.
    remote_workers: int = Field(default=0, ge=0)
    master_host: str = "127.0.0.1"  # the master's bind address ("0.0.0.0": other hosts too)
    master_port: int = Field(default=0, ge=0, le=65535)  # 0: a free port (see master.json)
    workers_wait_s: float = Field(default=60.0, gt=0)  # for every worker to connect
    # The run's cache salt; user i sends `<salt>-bg<i>` (`user_salt`), so each background user
    # has a prefix cache of its own, as a real agent does. None: `bg-<seed>-<origin>`.
    cache_salt: str | None = None
    max_model_len: int = Field(default=8192, gt=0)  # prompts are capped to fit (replay.py)
    histories: list[Path] = Field(default_factory=_default_histories)
    state_dir: Path | None = None
    block_file: Path | None = None
    workers_dir: Path | None = None  # local workers' raw records (unset: one folder per start)
    seed: int = 0
    api_key_env: str | None = "API_KEY"  # the server's key is read from this variable, if set
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=3600.0, gt=0)
    replay: ReplayOptions = ReplayOptions()

    @property
    def api_url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return api_url(self.server_url)

    @property
    def processes(self) -> int:
        """The locust processes that run users: the workers, or the one local process."""
        return self.workers + self.remote_workers or 1

    def user_salt(self, slot: int) -> str:
        """User `slot`'s cache_salt: the same for all its requests (its own prefix hits), and
        different from every other user's (64 users cost the server what 64 agents do).
        The run's part: `cache_salt`, else a `cache_salt` in `replay.extra_body` (once shared
        by all users), else `bg-<seed>-<origin>`."""
        run = self.cache_salt or self.replay.extra_body.get(dialect.CACHE_SALT) or (
            f"bg-{self.seed}-{self.origin:.6f}")
        return f"{run}-bg{slot}"

    def resolved(self) -> BackgroundConfig:
        """Absolute paths and the defaults filled in (what the locust processes receive)."""
        state = (self.state_dir or self.out.parent / "background").resolve()
        # a folder per start: a resumed run's load never meets an earlier start's records
        started = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        return self.model_copy(update={
            "out": self.out.resolve(), "state_dir": state,
            "histories": [h.resolve() for h in self.histories],
            "block_file": (self.block_file or state / "block").resolve(),
            "workers_dir": (self.workers_dir or state / "workers" / started).resolve()})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BackgroundConfig:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))


__all__ = ["BackgroundConfig", "BackgroundLoad", "BackgroundLoadError", "LoadStatus"]


@dataclass(frozen=True)
class ServiceProbe:
    """One unloaded request's time to first token and decode rate: the service time that paces
    background turns whose histories recorded none."""

    ttft_s: float
    tokens_per_s: float
    tokens: int


def measure_service(url: str, model: str, *, tokens: int = 32, api_key: str | None = None,
                    repeats: int = 2) -> ServiceProbe:
    """Measure the server's unloaded service time (the better of `repeats` requests of
    `tokens` tokens each, `ignore_eos`): raises `BackgroundLoadError` if the server fails."""
    best: ServiceProbe | None = None
    for number in range(repeats):
        got = send_once(api_url(url), {
            "model": model, **dialect.length(tokens), "temperature": 0.0,
            "messages": [{"role": "user", "content": "Describe the weather in one paragraph."}]},
            request_id=f"service-probe-{number}", read_timeout_s=600, api_key=api_key).record
        if not got.ok or got.first_token_s is None or got.end_s is None:
            raise BackgroundLoadError(f"the service-time probe failed on {url}: {got.error}")
        decode = max(got.end_s - got.first_token_s, 1e-6)
        made = max(1, (got.completion_tokens or tokens) - 1)
        probe = ServiceProbe(ttft_s=got.first_token_s - got.sent_s,
                             tokens_per_s=made / decode, tokens=got.completion_tokens or tokens)
        if best is None or probe.ttft_s + tokens / probe.tokens_per_s < (
                best.ttft_s + tokens / best.tokens_per_s):
            best = probe
    assert best is not None
    return best


class BackgroundLoadError(UnavailableError):
    """The background load did not start or reach steady state; the text says why."""


@dataclass(frozen=True)
class LoadStatus:
    """The load's counters summed over its processes (see `loadgen.locust_user.Counters`)."""

    processes: int  # status files seen (1 local, or 1 master + N workers)
    users: int
    started: int
    failed_first: int  # users whose first request failed
    answered: int
    in_flight: int
    sent: int
    done: int
    ok: int
    errors: int
    unauthorized: int
    last_ok_t: float  # time.monotonic() of the latest successful reply (0: none yet)
    running: bool


class BackgroundLoad:
    """One background load; see the module docstring. Not reusable after `stop()`."""

    def __init__(self, config: BackgroundConfig, *, stop_grace_s: float = 10.0) -> None:
        self.config = config.resolved()
        assert self.config.state_dir is not None
        self.state_dir = self.config.state_dir
        self.stop_grace_s = stop_grace_s
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / "locust.log"
        assert self.config.workers_dir is not None
        self.workers_dir = self.config.workers_dir
        self.merged = False

    def start(self) -> BackgroundLoad:
        if self.process is not None:
            raise BackgroundLoadError("this background load was already started")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for old in self.state_dir.glob("status-*.json"):
            old.unlink()
        if self.config.workers and self.workers_dir.is_dir() and any(
                self.workers_dir.iterdir()):
            raise BackgroundLoadError(
                f"{self.workers_dir} holds worker records of an earlier load: merge them "
                "(compaction-bench load merge) or give the load another workers_dir")
        config_path = self.state_dir / "config.json"
        self.config.save(config_path)
        if self.config.remote_workers:
            # remote workers' records stay on their hosts: written down before they start,
            # so the run says how many are missing until merged (`merge.pending_remote`)
            from compaction_bench.loadgen.merge import REMOTE_FILE

            append_jsonl(self.state_dir / REMOTE_FILE, {
                "remote_workers": self.config.remote_workers,
                "master": f"{self.config.master_host}:{self.config.master_port}",
                "local_workers": self.config.workers, "wall_s": time.time()})
        self.set_block(None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "compaction_bench.loadgen.locust_main", "--config",
                 str(config_path)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.stop)
        return self

    def set_block(self, block: int | None) -> None:
        """Label the background records sent from now on with `block` (None: outside blocks)."""
        if self.config.block_file is None:
            return
        write_text_atomic(Path(self.config.block_file), "" if block is None else str(block),
                          durable=False)

    def status(self) -> LoadStatus:
        rows: list[dict[str, Any]] = []
        for path in self.state_dir.glob("status-*.json"):
            with contextlib.suppress(OSError, ValueError):
                rows.append(json.loads(path.read_text(encoding="utf-8")))

        def total(key: str) -> int:
            return sum(int(r.get(key, 0)) for r in rows)

        running = self.process is not None and self.process.poll() is None
        return LoadStatus(
            processes=len(rows), users=total("users"), started=total("started"),
            failed_first=total("failed_first"), answered=total("answered"),
            in_flight=total("in_flight"), sent=total("sent"),
            done=total("done"), ok=total("ok"), errors=total("errors"),
            unauthorized=total("unauthorized"),
            last_ok_t=max((float(r.get("last_ok_t", 0.0)) for r in rows), default=0.0),
            running=running)

    def wait_steady(self, timeout_s: float = 120.0, *, poll_s: float = 0.2) -> LoadStatus:
        """Block until every user is spawned and has sent its first request, none of which
        failed; raises `BackgroundLoadError` (with the log's tail) when the load dies, is refused
        as unauthorized, its first requests fail, or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        users = self.config.users
        while True:
            status = self.check()
            if status.failed_first:
                raise BackgroundLoadError(
                    f"{status.failed_first} of {users} background users' first requests failed "
                    f"(first error in {self.config.out}); log {self.log_path}")
            if status.users >= users and status.started >= users:
                return status
            if time.monotonic() > deadline:
                raise BackgroundLoadError(
                    f"no steady state within {timeout_s:.0f}s: {status.users}/{users} users "
                    f"spawned, {status.started} sent their first request (raise spawn_rate or "
                    f"the timeout; log {self.log_path})")
            time.sleep(poll_s)

    def check(self) -> LoadStatus:
        """The load's status, raising `BackgroundLoadError` unless it is alive (its processes
        run), authorised (no HTTP 401/403) and answering (once requests have ended, some ended
        well). The bench calls it at every block boundary."""
        status = self.status()
        if not status.running:
            code = self.process.poll() if self.process is not None else None
            raise BackgroundLoadError(
                f"the background load stopped (exit code {code}); log {self.log_path}:\n"
                f"{self._tail()}")
        if status.unauthorized:
            raise BackgroundLoadError(
                f"{status.unauthorized} background requests were refused as unauthorized (HTTP "
                "401/403): the server wants a key; set API_KEY for the run (the load reads it "
                "from the environment)")
        if status.done >= max(3, self.config.users) and status.ok == 0:
            raise BackgroundLoadError(
                f"none of the {status.done} background requests that ended succeeded (see "
                f"{self.config.out}); log {self.log_path}")
        return status

    def stop(self) -> int | None:
        """Stop every locust process (idempotent); returns the main process's exit code."""
        process = self.process
        if process is None:
            return None
        # the whole group, even after the master ended: workers may linger after it
        code = stop_tree(process, grace_s=self.stop_grace_s)
        atexit.unregister(self.stop)
        if self.config.workers and not self.merged:
            self.merged = True  # once: stop() is idempotent
            # Local workers' raw records join the run's file; remote workers' folders are
            # merged with `compaction-bench load merge` once copied here (docs/load.md).
            from compaction_bench.loadgen.merge import merge_workers

            merge_workers([self.workers_dir], self.config.out,
                          expected_workers=self.config.workers, remote=False)
        return code

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
