"""Replicas and the router, without starting anything: the layout (ports, CPUs, GPUs), the
commands, the session header, the bench's replica targets and the attribution of requests."""

from __future__ import annotations

import os

import pytest

from compaction_bench.bench.run.block import arm_session
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.telemetry import replica_targets
from compaction_bench.loadgen.replica_metrics import infer_replicas
from compaction_bench.serve.command import ServerConfig, build_command, build_env
from compaction_bench.serve.process import pid_file, write_pid_file
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import ReplicaError, cpu_shares, gpu_shares, replica_configs
from compaction_bench.serve.router import RouterConfig, local_fleet, router_command
from compaction_bench.serve.share import cpu_list
from compaction_bench.transport.request import SESSION_HEADER, prepare


def test_cpus_are_split_into_disjoint_contiguous_shares() -> None:
    assert cpu_shares(2, [0, 1]) == [(0,), (1,)]
    assert cpu_shares(2, [0, 1, 2, 3, 4]) == [(0, 1, 2), (3, 4)]
    assert cpu_shares(1, [3, 1]) == [(1, 3)]
    with pytest.raises(ReplicaError, match=r"3 replicas need at least 3 CPUs.*REPLICAS=2"):
        cpu_shares(3, [0, 1])
    assert cpu_list((0, 1, 2, 5)) == "0-2,5"
    assert gpu_shares(2, 2, 4) == [(0, 1), (2, 3)]
    with pytest.raises(ReplicaError, match="need 4 GPUs; this machine has 2: use REPLICAS=1"):
        gpu_shares(2, 2, 2)


def test_each_cpu_replica_runs_pinned_on_its_own_port() -> None:
    base = ServerConfig(profile=load_profile("cpu-tiny"), port=8000)
    configs = replica_configs(base, 2, cpus=[0, 1])
    assert [c.port for c in configs] == [8002, 8003]  # 8001: the embedded compressor's
    assert [c.cpus for c in configs] == [(0,), (1,)]
    command = build_command(configs[1], "model-dir")
    assert command[:3] == ["taskset", "-c", "1"] and "--port" in command
    assert build_env(configs[1])["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    unpinned = build_env(base).get("VLLM_CPU_OMP_THREADS_BIND")
    assert unpinned == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")  # one server: as it was
    fake = replica_configs(ServerConfig(profile=load_profile("fake-faults"), port=9000), 3)
    assert [c.port for c in fake] == [9002, 9003, 9004] and all(not c.cpus for c in fake)
    with pytest.raises(ReplicaError, match="REPLICAS=0"):
        replica_configs(base, 0)


def test_router_command_names_policy_replicas_and_no_retries() -> None:
    config = RouterConfig(worker_urls=("http://127.0.0.1:8001/v1", "http://127.0.0.1:8002"),
                          policy="round_robin", port=8000)
    command = router_command(config, binary="vllm-router")
    assert command[command.index("--worker-urls") + 1:][:2] == [
        "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert command[command.index("--policy") + 1] == "round_robin"
    assert "--disable-retries" in command
    assert command[command.index("--prometheus-port") + 1] == "9000"
    with pytest.raises(ValueError, match=r"unknown router policy 'sticky'.*ROUTER_POLICY"):
        RouterConfig(worker_urls=("http://a:1",), policy="sticky")


def test_a_session_id_is_a_header_and_a_field_of_the_record() -> None:
    request = prepare("http://h:1/v1", {"model": "target", "messages": []}, request_id="r",
                      session_id="agent-3")
    assert (SESSION_HEADER, "agent-3") in request.headers and request.session_id == "agent-3"
    plain = prepare("http://h:1/v1", {"model": "target", "messages": []}, request_id="r")
    assert plain.headers == () and plain.session_id is None
    assert arm_session("shared", 2, "self", "original") == "shared-b2-self-original"


def test_the_bench_finds_the_replicas_of_a_local_router_or_takes_them_given() -> None:
    try:
        _finds_them()
    finally:  # this test's own pid: no `stop` may ever find it
        pid_file(18777).unlink(missing_ok=True)


def _finds_them() -> None:
    write_pid_file(18777, {"pid": os.getpid(), "pgid": os.getpid(), "port": 18777, "router": {
        "policy": "round_robin", "metrics_url": "http://127.0.0.1:19777",
        "replicas": [{"url": "http://127.0.0.1:18778"}, {"url": "http://127.0.0.1:18779"}]}})
    found = local_fleet(18777)
    assert found == (("http://127.0.0.1:18778", "http://127.0.0.1:18779"),
                     "http://127.0.0.1:19777")
    targets = replica_targets(BenchConfig(port=18777))
    assert targets is not None and targets.urls == found[0]
    assert targets.router_metrics_url == "http://127.0.0.1:19777"
    assert replica_targets(BenchConfig(port=18777, base_url="http://elsewhere:18777")) is None
    given = replica_targets(BenchConfig(base_url="http://k8s:80", replica_urls=(
        "http://pod-a:8000/v1", "http://pod-b:8000")))
    assert given is not None and given.urls == ("http://pod-a:8000", "http://pod-b:8000")
    assert given.router_metrics_url is None
    assert replica_targets(BenchConfig(port=18780)) is None  # one server


def _line(t: float, replica: str, finished: float) -> dict[str, object]:
    return {"t_s": t, "replica": replica, "requests_finished": finished}


def test_a_request_goes_to_the_only_replica_whose_count_rose_as_it_ended() -> None:
    lines = [_line(0.0, "a", 0), _line(0.0, "b", 0), _line(1.0, "a", 1), _line(1.0, "b", 0),
             _line(2.0, "a", 1), _line(2.0, "b", 1), _line(3.0, "a", 2), _line(3.0, "b", 2),
             _line(4.0, "a", 2), _line(4.0, "b", 2)]
    requests = [
        {"request_id": "r1", "status": "ok", "end_s": 0.7},  # only a rose in (0, 1]
        {"request_id": "r2", "status": "ok", "end_s": 1.6},  # only b rose in (1, 2]
        {"request_id": "r3", "status": "ok", "end_s": 2.5},  # both rose in (2, 3]
        {"request_id": "r4", "status": "ok", "end_s": 3.5},  # nobody rose
        {"request_id": "r5", "status": "error", "end_s": 0.5},
    ]
    found = infer_replicas(requests, lines)
    assert {k: v.replica for k, v in found.items()} == {"r1": "a", "r2": "b", "r3": None,
                                                         "r4": None}
    assert found["r3"].how.startswith("ambiguous: 2 replicas")
    assert found["r4"].how.startswith("no replica's")
    # two requests cannot both be the one request a's counter finished then
    twice = infer_replicas([{"request_id": "x", "status": "ok", "end_s": 0.5},
                            {"request_id": "y", "status": "ok", "end_s": 0.6}], lines)
    assert all(a.replica is None for a in twice.values())


def test_through_a_router_metrics_lines_are_the_replicas_sum() -> None:
    from compaction_bench.loadgen.metrics import combined

    a = {"num_requests_running": 2.0, "kv_cache_usage": 0.5, "prefix_cache_hits": 100.0,
         "requests_finished": None}
    b = {"num_requests_running": 1.0, "kv_cache_usage": 0.1, "prefix_cache_hits": 28.0,
         "requests_finished": 4.0}
    assert combined([a, b]) == {"num_requests_running": 3.0, "kv_cache_usage": 0.3,
                                "prefix_cache_hits": 128.0, "requests_finished": None}
