"""`make bench ROUTER_POLICY=a,b` without starting anything: which replicas a per-policy router
goes in front of, the one-line error when none are known, and which run folder each policy
gets (new, refused as existing, resumed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.bench.run.config import BenchConfig, BenchError
from compaction_bench.bench.run.routing import (
    fleet_replicas,
    policy_runs,
    sibling_policies,
)
from compaction_bench.bench.run.telemetry import measured_router
from compaction_bench.bench.runfolder import write_json
from compaction_bench.serve.router import routing_key

POLICIES = ("round_robin", "consistent_hash")


def _config(tmp: Path, **more: object) -> BenchConfig:
    return BenchConfig(router_policy=POLICIES, results_dir=str(tmp), port=18297,
                       **more)  # type: ignore[arg-type]


def _child(tmp: Path, name: str, policy: str | None, base: str = "rt") -> None:
    manifest: dict[str, object] = {"run_id": name, "config": {"regime": "dedicated"}}
    if policy is not None:
        manifest["router"] = {"policy": policy}
        manifest["routing"] = {"base": base, "policies": list(POLICIES)}
    write_json(tmp / name / "manifest.json", manifest)


def test_no_known_replicas_is_one_line_naming_both_fixes(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as caught:
        fleet_replicas(_config(tmp_path))  # no `make serve REPLICAS=n` on port 18297
    message = str(caught.value)
    assert "\n" not in message
    assert "ROUTER_POLICY=round_robin,consistent_hash" in message
    assert "REPLICA_URLS=" in message and "`make serve REPLICAS=2` (PORT=18297)" in message
    given = fleet_replicas(_config(tmp_path, replica_urls=("http://a:1/v1", "http://b:2")))
    assert given == ("http://a:1", "http://b:2")


def test_each_policy_gets_its_own_folder_and_an_existing_one_is_refused(tmp_path: Path) -> None:
    base, plan = policy_runs(_config(tmp_path, run_id="rt"))
    assert base == "rt"
    assert [(p, c.run_id, c.resume, c.router_policy) for p, c in plan] == [
        ("round_robin", "rt-round_robin", None, ("round_robin",)),
        ("consistent_hash", "rt-consistent_hash", None, ("consistent_hash",))]
    (tmp_path / "rt-consistent_hash").mkdir()
    with pytest.raises(BenchError, match=r"rt-consistent_hash exists; pass RESUME=rt \(with "
                       r"ROUTER_POLICY=round_robin,consistent_hash\)"):
        policy_runs(_config(tmp_path, run_id="rt"))
    default, _ = policy_runs(_config(tmp_path))
    assert default.startswith("dedicated-")  # regime and UTC time, as a run on one server


def test_resume_continues_each_policys_folder_or_the_one_named(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="cannot resume rt: no run folder rt nor "
                       "rt-round_robin, rt-consistent_hash"):
        policy_runs(_config(tmp_path, resume="rt"))
    _child(tmp_path, "rt-round_robin", "round_robin")
    base, plan = policy_runs(_config(tmp_path, resume="rt"))  # one done, the other still to start
    assert base == "rt" and [(p, c.run_id, c.resume) for p, c in plan] == [
        ("round_robin", None, "rt-round_robin"),
        ("consistent_hash", "rt-consistent_hash", None)]
    base, plan = policy_runs(_config(tmp_path, resume="rt-round_robin"))  # one policy's folder
    assert base == "rt" and [(p, c.resume, c.router_policy) for p, c in plan] == [
        ("round_robin", "rt-round_robin", ("round_robin",))]
    with pytest.raises(BenchError, match="ran under router policy round_robin, not random"):
        policy_runs(BenchConfig(router_policy=("random",), results_dir=str(tmp_path),
                          resume="rt-round_robin"))
    _child(tmp_path, "plain", None)
    with pytest.raises(BenchError, match="RESUME=plain is a run on one server"):
        policy_runs(_config(tmp_path, resume="plain"))
    assert sibling_policies(_config(tmp_path), "rt") == ["round_robin"]


def test_a_run_through_make_serves_router_records_its_policy() -> None:
    import os

    from compaction_bench.serve.process import pid_file, write_pid_file

    try:
        write_pid_file(18296, {"pid": os.getpid(), "pgid": os.getpid(), "port": 18296,
                               "router": {"policy": "cache_aware",
                                          "metrics_url": "http://127.0.0.1:19296",
                                          "replicas": [{"url": "http://127.0.0.1:18294"},
                                                       {"url": "http://127.0.0.1:18295"}]}})
        found = measured_router(BenchConfig(port=18296))
    finally:  # this test's own pid: no `stop` may ever find it
        pid_file(18296).unlink(missing_ok=True)
    assert found == {"policy": "cache_aware", "routing_key": routing_key("cache_aware"),
                     "url": "http://127.0.0.1:18296",
                     "replicas": ["http://127.0.0.1:18294", "http://127.0.0.1:18295"],
                     "metrics_url": "http://127.0.0.1:19296",
                     "started_by": "make serve REPLICAS=2 on port 18296"}
    elsewhere = measured_router(BenchConfig(base_url="http://k8s:80",
                                            replica_urls=("http://pod-a:8000",)))
    assert elsewhere is not None and elsewhere["policy"].startswith("not known")
    assert elsewhere["routing_key"].startswith("not known")
    assert measured_router(BenchConfig(port=18296)) is None  # one server: no router
