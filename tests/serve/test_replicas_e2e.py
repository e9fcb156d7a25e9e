"""The real vllm-router in front of two replicas of the suite's fake engine (the `fake-faults`
profile through the real launcher): routing by policy, sessions, per-replica metrics and
stopping everything. The real vLLM CPU server is not run twice here (2 cores)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from compaction_bench.common.files import read_jsonl
from compaction_bench.loadgen.replica_metrics import (
    ReplicaSampler,
    ReplicaTargets,
    infer_replicas,
)
from compaction_bench.serve.launcher import ServerConfig
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import Fleet, FleetConfig, check_router
from compaction_bench.transport.client import send_once

pytestmark = pytest.mark.e2e


def _free_block() -> int:
    """A port P with P, P+2, P+3 (the replicas) and P+1000 (the router's Prometheus) free."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 1000 > 65535:
            continue
        try:
            for p in (port + 2, port + 3, port + 1000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no block of free ports")


def _fleet(policy: str) -> Fleet:
    config = ServerConfig(profile=load_profile("fake-faults"), port=_free_block())
    return Fleet(FleetConfig(server=config, replicas=2, policy=policy))


@pytest.fixture
def round_robin() -> Iterator[Fleet]:
    fleet = _fleet("round_robin")
    fleet.start()
    yield fleet
    fleet.stop()


def _ask(fleet: Fleet, text: str, session: str, ttft_ms: float = 5.0) -> None:
    got = send_once(fleet.api_url, {"model": "target", "max_tokens": 2, "fake": {
        "ttft_ms": ttft_ms}, "messages": [{"role": "user", "content": text}]},
        request_id=text, session_id=session)
    assert got.record.ok, got.record.error
    assert got.record.session_id == session


def _seen(fleet: Fleet) -> list[list[str]]:
    """The user texts each replica received (the fake keeps every body)."""
    out = []
    for server in fleet.servers:
        bodies = httpx.get(server.server_url + "/fake/requests", timeout=10).json()
        out.append([b["messages"][-1]["content"] for b in bodies])
    return out


def _tree(fleet: Fleet) -> list[psutil.Process]:
    pids = [s.process.pid for s in fleet.servers if s.process is not None]
    assert fleet.router.process is not None
    pids.append(fleet.router.process.pid)
    return [psutil.Process(p) for p in pids]


def _assert_gone(procs: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"left running: {[p.pid for p in alive]}")


def test_round_robin_spreads_and_replicas_are_sampled_and_attributed(
        round_robin: Fleet, tmp_path: Path) -> None:
    fleet = round_robin
    lines = check_router(fleet, "target")  # the serve-time check through the router
    assert "4/4 requests answered" in lines[0]
    assert all("finished 2 (its /metrics), router sent 2" in line for line in lines[1:])
    path = tmp_path / "replica_metrics.jsonl"
    targets = ReplicaTargets(tuple(s.server_url for s in fleet.servers),
                             fleet.router.config.prometheus_url)
    records = []
    with ReplicaSampler(targets, path, interval_s=0.05):
        # a request's replica is inferred from a counter rising between two samples: wait for
        # every replica's first sample (a CI run's loaded start left rr-0 with none before it)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (path.is_file() and {
                line["replica"] for line in read_jsonl(path).objects} == set(targets.urls)):
            time.sleep(0.05)
        for i in range(6):  # one at a time, each slow enough to end alone
            got = send_once(fleet.api_url, {"model": "target", "max_tokens": 2, "fake": {
                "ttft_ms": 300}, "messages": [{"role": "user", "content": f"rr-{i}"}]},
                request_id=f"rr-{i}", session_id=f"agent-{i}")
            assert got.record.ok
            records.append(got.record.to_json())
            time.sleep(0.2)
    seen = _seen(fleet)
    assert sorted(len([t for t in s if t.startswith("rr-")]) for s in seen) == [3, 3]
    sampled = read_jsonl(path).objects
    assert {line["replica"] for line in sampled} == set(targets.urls)
    last = {line["replica"]: line for line in sampled}
    assert all(line["requests_finished"] == 5 and line["routed_requests"] == 5
               for line in last.values())  # 2 of the check + 3 each
    truth = {text: url for url, texts in zip(targets.urls, seen, strict=True) for text in texts}
    found = infer_replicas(records, sampled)
    assert {rid: a.replica for rid, a in found.items()} == {
        f"rr-{i}": truth[f"rr-{i}"] for i in range(6)}


def test_consistent_hash_keeps_each_session_on_one_replica() -> None:
    fleet = _fleet("consistent_hash")
    fleet.start()
    try:
        for turn in range(3):
            for agent in range(16):
                _ask(fleet, f"agent-{agent} turn-{turn}", session=f"agent-{agent}")
        seen = _seen(fleet)
    finally:
        fleet.stop()
    homes = {a: {i for i, texts in enumerate(seen) if any(t.startswith(f"agent-{a} ")
                                                          for t in texts)} for a in range(16)}
    assert all(len(h) == 1 for h in homes.values()), homes  # every turn on the agent's replica
    assert {i for h in homes.values() for i in h} == {0, 1}  # and both replicas used


def test_fleet_stop_leaves_no_process(round_robin: Fleet) -> None:
    procs = _tree(round_robin)
    assert all(p.is_running() for p in procs)
    round_robin.stop()
    _assert_gone(procs)


def test_make_serve_replicas_then_make_stop_stops_them_all(tmp_path: Path) -> None:
    """The command `make serve REPLICAS=2` runs, in the foreground; `stop --port` ends the
    router and its replicas, and the foreground command exits 0. Then Ctrl-C does the same."""
    for ending in ("stop", "ctrl-c"):
        port = _free_block()
        proc = subprocess.Popen(
            [sys.executable, "-m", "compaction_bench", "serve", "--profile", "fake-faults",
             "--port", str(port), "--replicas", "2", "--router-policy", "round_robin",
             "--no-selfcheck"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout is not None
        try:
            _serve_then_end(proc, port, ending)
        finally:  # a failure kills the tree and closes the pipe: nothing leaks into a later test
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
                proc.wait(timeout=30)
            proc.stdout.close()


def _serve_then_end(proc: subprocess.Popen[str], port: int, ending: str) -> None:
    assert proc.stdout is not None
    log = []
    for line in proc.stdout:
        log.append(line)
        if "== serving" in line:
            break
    assert any("behind vllm-router (round_robin)" in line for line in log), "".join(log)
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert len(tree) >= 3  # two replicas and the router
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    if ending == "stop":
        stopped = subprocess.run([sys.executable, "-m", "compaction_bench", "stop",
                                  "--port", str(port)], capture_output=True, text=True,
                                 timeout=60, check=False)
        # the router and both replicas, each stopped by `stop` or, where the foreground
        # serve ended a replica first (a race on 2 cores), named as already stopped
        assert (stopped.stdout.count("stopped server on port")
                + stopped.stdout.count("already stopped")) == 3, stopped.stdout
        assert "stopped server on port" in stopped.stdout.splitlines()[0], stopped.stdout
    else:
        proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    _assert_gone([psutil.Process(proc.pid), *tree] if proc.poll() is None else tree)
