"""Entry point of the locust processes (started by `loadgen/background.py`, never imported by
it).

    python -m compaction_bench.loadgen.locust_main --config STATE/config.json    # local/master
    python -m compaction_bench.loadgen.locust_main --worker --master HOST:PORT --out DIR
    (the second is also `compaction-bench load worker`, on any host that reaches the master)

locust is imported first, so gevent's monkey-patching happens before ssl or anything else is
loaded. The process drives locust as a library (`Environment`, local / master / worker runner).
With `workers = N` (and/or `remote_workers = M`) it is the master: it starts the N local
workers itself (same process group), waits for all N + M, sends each the setup message (the
config, the histories' text, the schedule's start: a worker needs nothing but the master's
address), answers each worker's anchor reply (`loadgen/merge.py`), relays block changes, and
sums the workers' counters. Users run only on workers, each writing its own raw records into
its `--out` folder (the local ones: `<state>/workers/`).

It stops on SIGTERM/SIGINT, when its parent dies, or after `duration_s` where one is set, and
the local process or master writes `status-<pid>.json` (counters) to the state folder twice a
second.
"""

from __future__ import annotations

# isort: off
from locust import events  # first: monkey-patches the standard library with gevent
import gevent

# isort: on
import argparse
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from locust.env import Environment
from locust.runners import Runner

from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.net import free_port
from compaction_bench.loadgen.background import BackgroundConfig
from compaction_bench.loadgen.locust_user import BackgroundAgent, _current_block
from compaction_bench.loadgen.merge import Anchor, WorkerFiles, worker_files, write_sidecar

log = logging.getLogger("compaction_bench.loadgen.locust_main")
BLOCK_POLL_S = 0.02  # how often the master looks for a block change to relay to workers
ANCHOR_PINGS = 5  # clock-anchor round trips per worker; each keeps its tightest
ANCHOR_PING_GAP_S = 0.03


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One locust process of the background load.")
    parser.add_argument("--config", help="BackgroundConfig JSON file (local process or master)")
    parser.add_argument("--worker", action="store_true", help="a worker of --master")
    parser.add_argument("--master", help="HOST:PORT of the master (workers)")
    parser.add_argument("--out", help="folder for this worker's raw records (workers)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    if args.worker:
        if not args.master or not args.out:
            parser.error("a worker needs --master HOST:PORT and --out DIR")
        host, _, port = args.master.rpartition(":")
        if not host or not port.isdigit():
            parser.error(f"--master {args.master!r}: give HOST:PORT, e.g. 10.0.0.5:5557")
        return _worker(host, int(port), Path(args.out))
    if not args.config:
        parser.error("--config is required (or --worker)")
    config = BackgroundConfig.load(args.config)
    if config.workers or config.remote_workers:
        return _master(config)
    return _local(config)


def _environment() -> Environment:
    return Environment(user_classes=[BackgroundAgent], events=events)


def _locust_rate(config: BackgroundConfig) -> float:
    # Locust spawns every user at once; each user waits for its own planned start.
    return float(max(100, config.users * 10))


def _local(config: BackgroundConfig) -> int:
    BackgroundAgent.setup(config)
    env = _environment()
    runner = env.create_local_runner()
    BackgroundAgent.t0 = time.monotonic()
    runner.start(config.users, spawn_rate=_locust_rate(config))
    log.info("background load: local, %d users, %s, regime %s", config.users, config.api_url,
             config.regime)
    status = _status_path(config)
    return _serve(runner, config.duration_s, lambda stopped: _write_status(
        status, "local", stopped, [BackgroundAgent.counters.as_dict()]))


def _master(config: BackgroundConfig) -> int:
    env = _environment()
    port = config.master_port or free_port(
        "127.0.0.1" if config.master_host in ("0.0.0.0", "*") else config.master_host)
    runner = env.create_master_runner(config.master_host, port)
    state = config.state_dir
    assert state is not None, "the runner passes a resolved config"
    write_json_atomic(state / "master.json", {"host": socket.gethostname(),
                                              "bind": config.master_host, "port": port})
    counters: dict[str, dict[str, float]] = {}

    answered: dict[str, int] = {}

    def on_anchor(environment: Environment, msg: Any, **_: Any) -> None:
        back = time.monotonic()
        runner.send_message("anchor_back", {**msg.data, "master_back_s": back},
                            client_id=msg.node_id)
        answered[msg.node_id] = answered.get(msg.node_id, 0) + 1

    def on_counters(environment: Environment, msg: Any, **_: Any) -> None:
        counters[msg.node_id] = msg.data

    ready: set[str] = set()
    runner.register_message("anchor", on_anchor)
    runner.register_message("counters", on_counters)
    runner.register_message("setup_done", lambda environment, msg, **_: ready.add(msg.node_id))
    connect = "127.0.0.1" if config.master_host in ("0.0.0.0", "*") else config.master_host
    assert config.workers_dir is not None, "the runner passes a resolved config"
    workers = [subprocess.Popen([sys.executable, "-m", "compaction_bench.loadgen.locust_main",
                                 "--worker", "--master", f"{connect}:{port}",
                                 "--out", str(config.workers_dir)])
               for _ in range(config.workers)]
    total = config.workers + config.remote_workers
    log.info("background master on %s:%d: waiting for %d local and %d remote workers", connect,
             port, config.workers, config.remote_workers)
    _wait_workers(runner, total, config.workers_wait_s)
    histories = {str(p): p.read_text(encoding="utf-8") for p in config.histories}
    runner.send_message("setup", {"config": config.model_dump_json(), "histories": histories,
                                  "master_sent_s": time.monotonic()})
    _wait_for(lambda: len(ready) >= total, config.workers_wait_s,
              lambda: f"only {len(ready)} of {total} locust workers loaded the schedules")
    _anchor_pings(runner)  # with nothing else on the wire: the tightest anchors
    # every answer back before the start, so each worker schedules with the anchor it keeps
    _wait_for(lambda: sum(answered.values()) >= ANCHOR_PINGS * total, config.workers_wait_s,
              lambda: f"only {sum(answered.values())} of {ANCHOR_PINGS * total} clock-anchor "
              "pings answered")
    # the schedule's start, on the master's clock; each worker moves it onto its own
    runner.send_message("start", {"t0": time.monotonic() + 0.05})
    runner.start(config.users, spawn_rate=_locust_rate(config))
    log.info("background load: master, %d workers, %d users, %s, regime %s", total,
             config.users, config.api_url, config.regime)
    gevent.spawn(_relay_blocks, runner, config.block_file)
    status = _status_path(config)
    code = _serve(runner, config.duration_s, lambda stopped: _write_status(
        status, "master", stopped, list(counters.values())))
    for worker in workers:
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
    return code


def _worker(host: str, port: int, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    files = worker_files(out, f"{socket.gethostname()}-{os.getpid()}")
    env = _environment()
    runner = env.create_worker_runner(host, port)
    me: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    clock: dict[str, float] = {"offset_s": 0.0}  # master time - worker time, from the setup

    def on_setup(environment: Environment, msg: Any, **_: Any) -> None:
        # a first estimate (one way: late by the message's transit); the pings refine it
        clock["offset_s"] = msg.data["master_sent_s"] - time.monotonic()
        _setup_worker(files, BackgroundConfig.model_validate_json(msg.data["config"]),
                      msg.data["histories"])
        assert BackgroundAgent.config is not None
        me.update(index=runner.worker_index, origin_s=BackgroundAgent.config.origin)
        runner.send_message("setup_done", {})

    def on_start(environment: Environment, msg: Any, **_: Any) -> None:
        BackgroundAgent.t0 = msg.data["t0"] - clock["offset_s"]

    def on_ping(environment: Environment, msg: Any, **_: Any) -> None:
        arrived, wall = time.monotonic(), time.time()
        runner.send_message("anchor", {"worker_s": arrived, "worker_wall_s": wall, **msg.data})

    def on_back(environment: Environment, msg: Any, **_: Any) -> None:
        anchor = Anchor(**msg.data)
        best = me.get("anchor")
        if best is None or anchor.precision_s < Anchor(**best).precision_s:
            me["anchor"] = msg.data  # the tightest round trip of the pings
            clock["offset_s"] = anchor.offset_s
            write_sidecar(files, **me, records=BackgroundAgent.written, stopped=False)

    def on_block(environment: Environment, msg: Any, **_: Any) -> None:
        BackgroundAgent.block = msg.data["block"]

    runner.register_message("setup", on_setup)
    runner.register_message("start", on_start)
    runner.register_message("anchor_ping", on_ping)
    runner.register_message("anchor_back", on_back)
    runner.register_message("block", on_block)
    log.info("background worker %s: master %s:%d, records in %s", files.name, host, port, out)

    def report(stopped: bool) -> None:
        data = BackgroundAgent.counters.as_dict()
        if data["last_ok_t"]:  # on the master's clock, as its status file expects
            data["last_ok_t"] += clock["offset_s"]
        runner.send_message("counters", data)

    code = _serve(runner, None, report)
    gevent.sleep(0)  # users killed by the stop finish writing their last record
    if "anchor" in me:
        write_sidecar(files, **me, records=BackgroundAgent.written, stopped=True)
        log.info("background worker %s: %d records in %s", files.name,
                 BackgroundAgent.written, files.raw)
    else:
        log.warning("background worker %s stopped before the master's setup: no records",
                    files.name)
    return code


def _setup_worker(files: WorkerFiles, config: BackgroundConfig,
                  histories: dict[str, str]) -> None:
    """The master's config with this worker's raw file and local copies of the histories
    (records keep the master's history names)."""
    folder = files.raw.parent / "histories" / files.name
    folder.mkdir(parents=True, exist_ok=True)
    local = []
    for number, (name, text) in enumerate(histories.items()):
        path = folder / f"{number}-{Path(name).parent.name}-{Path(name).name}"
        path.write_text(text, encoding="utf-8")
        local.append(path)
    BackgroundAgent.setup(config.model_copy(update={"histories": local, "out": files.raw}),
                          raw=True)
    names = {str(path): name for path, name in zip(local, histories, strict=True)}
    BackgroundAgent.schedules = [[dataclasses.replace(turn, history=names[turn.history])
                                  for turn in schedule] for schedule in BackgroundAgent.schedules]


def _serve(runner: Runner, duration_s: float | None, report: Any) -> int:
    """Run until the runner ends (signal, parent gone, duration); `report(stopped)` twice a
    second and once at the end."""
    if duration_s is not None:
        gevent.spawn_later(duration_s, runner.quit)
    gevent.spawn(_watch, runner, report, os.getppid())
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, runner.quit)
    assert runner.greenlet is not None
    runner.greenlet.join()
    try:
        report(True)
    except Exception as exc:  # a worker whose master is gone still writes its sidecar
        log.warning("final status report failed: %s", exc)
    return 0


def _wait_workers(runner: Any, count: int, timeout_s: float) -> None:
    _wait_for(lambda: len(runner.clients.ready) >= count, timeout_s, lambda: (
        f"only {len(runner.clients.ready)} of {count} locust workers connected (start the "
        "remote ones with `compaction-bench load worker master=HOST:PORT out=DIR`)"))


def _wait_for(done: Any, timeout_s: float, why: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"{why()} within {timeout_s:.0f}s")
        gevent.sleep(0.02)


def _anchor_pings(runner: Any) -> None:
    """Small messages each worker answers at once (`loadgen/merge.py`); a round trip sent
    while nothing else is on the wire is the tightest anchor."""
    for _ in range(ANCHOR_PINGS):
        for client in list(runner.clients.ready):
            runner.send_message("anchor_ping", {"master_sent_s": time.monotonic(),
                                                "master_wall_s": time.time()},
                                client_id=client.id)
        gevent.sleep(ANCHOR_PING_GAP_S)


def _relay_blocks(runner: Runner, path: Path | None) -> None:
    """Send the block number to workers whenever the bench changes it (a worker on another
    host has no block file; one on this host reads the file itself, exact at each send). The
    relayed number lags the file by up to BLOCK_POLL_S plus the message's transit."""
    last: int | None = None
    sent = False
    while True:
        if path is None or path.exists():  # no file: no news, the last number stands
            block = _current_block(path, last)
            if block != last or not sent:
                runner.send_message("block", {"block": block})
                last, sent = block, True
        gevent.sleep(BLOCK_POLL_S)


def _watch(runner: Runner, report: Any, parent: int) -> None:
    """`report` twice a second; quit when the parent process is gone."""
    while True:
        try:
            report(False)
        except Exception as exc:  # a lost master connection must not end the watch
            log.warning("status report failed: %s", exc)
        if os.getppid() != parent:
            log.warning("parent process %d is gone: stopping the background load", parent)
            runner.quit()
            return
        gevent.sleep(0.5)


def _status_path(config: BackgroundConfig) -> Path:
    assert config.state_dir is not None, "the runner passes a resolved config"
    return config.state_dir / f"status-{os.getpid()}.json"


def _write_status(path: Path, role: str, stopped: bool,
                  parts: list[dict[str, float]]) -> None:
    keys = ("users", "started", "failed_first", "answered", "in_flight", "sent", "done", "ok",
            "errors", "unauthorized")
    data: dict[str, Any] = {"pid": os.getpid(), "role": role, "stopped": stopped,
                            "t_s": time.monotonic(), "processes": len(parts)}
    data.update({key: sum(int(p.get(key, 0)) for p in parts) for key in keys})
    data["last_ok_t"] = max((float(p.get("last_ok_t", 0.0)) for p in parts), default=0.0)
    write_json_atomic(path, data, indent=None, durable=False)


if __name__ == "__main__":
    sys.exit(main())
