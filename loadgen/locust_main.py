"""Entry point of the locust processes (started by `loadgen/background.py`, never imported by
it).

    python -m compaction_bench.loadgen.locust_main --config STATE/config.json            # local,
    or master
    python -m compaction_bench.loadgen.locust_main --config STATE/config.json --worker
    --master-port P

locust is imported first, so gevent's monkey-patching happens before ssl or anything else is
loaded. The process drives locust as a library (`Environment`, local / master / worker runner):
with `locust_workers = N` it is the master and starts N worker processes itself (same process
group). It stops on SIGTERM/SIGINT, when its parent dies, or after `duration_s` where one is set,
and
writes `status-<pid>.json` (counters) to the state folder twice a second.
"""

from __future__ import annotations

# isort: off
from locust import events  # first: monkey-patches the standard library with gevent
import gevent

# isort: on
import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from locust.env import Environment
from locust.runners import Runner
from locust.stats import print_stats

from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.net import free_port
from compaction_bench.loadgen.background import BackgroundConfig
from compaction_bench.loadgen.locust_user import BackgroundAgent

WORKER_CONNECT_TIMEOUT_S = 60.0
log = logging.getLogger("compaction_bench.loadgen.locust_main")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One locust process of the background load.")
    parser.add_argument("--config", required=True, help="BackgroundConfig JSON file")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--master-port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    config = BackgroundConfig.load(args.config)
    BackgroundAgent.setup(config, config.workers or 1)
    env = Environment(user_classes=[BackgroundAgent], events=events)
    workers: list[subprocess.Popen[bytes]] = []
    # Locust spawns every user at once; each user waits for its own planned start.
    locust_rate = float(max(100, config.users * 10))
    runner: Runner
    if args.worker:
        runner = env.create_worker_runner("127.0.0.1", args.master_port)
        runner.register_message("schedule", _take_schedule)
    elif config.workers:
        port = free_port()
        runner = env.create_master_runner("127.0.0.1", port)
        workers = [subprocess.Popen([sys.executable, "-m", "compaction_bench.loadgen.locust_main",
                                     "--config",
                                     args.config, "--worker", "--master-port", str(port)])
                   for _ in range(config.workers)]
        _wait_workers(runner, config.workers)
        runner.send_message("schedule", {"t0": time.monotonic()})
        runner.start(config.users, spawn_rate=locust_rate)
    else:
        runner = env.create_local_runner()
        BackgroundAgent.t0 = time.monotonic()
        runner.start(config.users, spawn_rate=locust_rate)
    role = "worker" if args.worker else "master" if workers else "local"
    log.info("background load: %s, %d users, %s, regime %s", role, config.users,
             config.api_url, config.regime)
    assert config.state_dir is not None, "the runner passes a resolved config"
    status_path = config.state_dir / f"status-{os.getpid()}.json"
    gevent.spawn(_watch, runner, status_path, role, os.getppid())
    if not args.worker and config.duration_s is not None:
        gevent.spawn_later(config.duration_s, runner.quit)
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, runner.quit)
    assert runner.greenlet is not None
    runner.greenlet.join()
    _write_status(status_path, role, stopped=True)
    for worker in workers:
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
    if not args.worker:
        print_stats(env.stats, current=False)
    return 0


def _take_schedule(environment: Environment, msg: Any, **_: Any) -> None:
    BackgroundAgent.t0 = float(msg.data["t0"])


def _wait_workers(runner: Any, count: int) -> None:
    deadline = time.monotonic() + WORKER_CONNECT_TIMEOUT_S
    while len(runner.clients.ready) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(runner.clients.ready)} of {count} locust workers "
                             f"connected within {WORKER_CONNECT_TIMEOUT_S:.0f}s")
        gevent.sleep(0.05)


def _watch(runner: Runner, path: Path, role: str, parent: int) -> None:
    """Status file twice a second; quit when the parent process is gone."""
    while True:
        _write_status(path, role, stopped=False)
        if os.getppid() != parent:
            log.warning("parent process %d is gone: stopping the background load", parent)
            runner.quit()
            return
        gevent.sleep(0.5)


def _write_status(path: Path, role: str, *, stopped: bool) -> None:
    data = {"pid": os.getpid(), "role": role, "stopped": stopped, "t_s": time.monotonic(),
            **BackgroundAgent.counters.as_dict()}
    write_json_atomic(path, data, indent=None, durable=False)


if __name__ == "__main__":
    sys.exit(main())
