"""Start and stop the background load from the bench (a normal process; never imports locust).

    config = BackgroundConfig(base_url="http://127.0.0.1:8000", users=8, regime="overloaded",
                              out=run_dir / "requests.jsonl", origin=run_start, workers=0)
    with BackgroundLoad(config) as load:      # start()
        load.wait_steady(timeout_s=120)       # every user has sent its first request
        load.set_block(3)                     # background records now carry block 3
        ...                                   # the arms of the block
    # stop(): SIGTERM to the process group, SIGKILL after a grace period

The locust processes run in a process group of their own, stop by themselves after
`duration_s`, and stop when this process dies; `stop()` (also registered with `atexit`) kills
the whole group, so none outlives the bench.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from loadgen.config import BackgroundConfig, ReplayOptions

__all__ = ["BackgroundConfig", "BackgroundLoad", "BackgroundLoadError", "LoadStatus",
           "ReplayOptions"]


class BackgroundLoadError(RuntimeError):
    """The background load did not start or reach steady state; the text says why."""


@dataclass(frozen=True)
class LoadStatus:
    processes: int  # status files seen (1 local, or 1 master + N workers)
    users: int
    started: int
    in_flight: int
    sent: int
    done: int
    errors: int
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

    def start(self) -> BackgroundLoad:
        if self.process is not None:
            raise BackgroundLoadError("this background load was already started")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for old in self.state_dir.glob("status-*.json"):
            old.unlink()
        config_path = self.state_dir / "config.json"
        self.config.save(config_path)
        self.set_block(None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "loadgen.locustmain", "--config", str(config_path)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.stop)
        return self

    def set_block(self, block: int | None) -> None:
        """Label the background records sent from now on with `block` (None: outside blocks)."""
        if self.config.block_file is None:
            return
        path = Path(self.config.block_file)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("" if block is None else str(block), encoding="utf-8")
        os.replace(tmp, path)

    def status(self) -> LoadStatus:
        rows: list[dict[str, Any]] = []
        for path in self.state_dir.glob("status-*.json"):
            with contextlib.suppress(OSError, ValueError):
                rows.append(json.loads(path.read_text(encoding="utf-8")))

        def total(key: str) -> int:
            return sum(int(r.get(key, 0)) for r in rows)

        running = self.process is not None and self.process.poll() is None
        return LoadStatus(len(rows), total("users"), total("started"), total("in_flight"),
                          total("sent"), total("done"), total("errors"), running)

    def wait_steady(self, timeout_s: float = 120.0, *, poll_s: float = 0.2) -> LoadStatus:
        """Block until every user is spawned and has sent its first request.

        Raises `BackgroundLoadError` (with the log's tail) when the load dies or times out.
        """
        deadline = time.monotonic() + timeout_s
        users = self.config.users
        while True:
            status = self.status()
            if status.users >= users and status.started >= users:
                return status
            if not status.running:
                raise BackgroundLoadError(f"the background load exited before steady state "
                                          f"({status}); log {self.log_path}:\n{self._tail()}")
            if time.monotonic() > deadline:
                raise BackgroundLoadError(
                    f"no steady state within {timeout_s:.0f}s: {status.users}/{users} users "
                    f"spawned, {status.started} sent their first request (raise spawn_rate or "
                    f"the timeout; log {self.log_path})")
            time.sleep(poll_s)

    def stop(self) -> int | None:
        """Stop every locust process (idempotent); returns the main process's exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=self.stop_grace_s)
        # workers may linger after the master: the group goes, whatever state it is in
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        atexit.unregister(self.stop)
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
