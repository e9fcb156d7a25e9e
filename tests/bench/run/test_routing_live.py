"""`make bench ROUTER_POLICY=round_robin,consistent_hash` through the real command and the real
vllm-router, in front of two fake engines (known timing: each request lasts longer than the 1 s
between scrapes, so it ends alone and its replica is known): one run folder per policy, the
routing comparison beside them, per-replica figures that add up, each router stopped after its
run, also on an error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from compaction_bench.bench.analysis.replicas import read_replica_lines
from compaction_bench.common.files import read_jsonl
from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.loadgen.replica_metrics import infer_replicas

pytestmark = pytest.mark.e2e

RECORD = "laguna-s-2.1__atcoder-abc400_b__rep-01__seed-1412000"
ARMS = ("clean", "external", "external-history")


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[FakeProcess, FakeProcess]]:
    with FakeProcess(FakeConfig(ttft_ms=1500, itl_ms=0.5)) as a, \
            FakeProcess(FakeConfig(ttft_ms=1500, itl_ms=0.5)) as b:
        yield a, b


def bench(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=replay", "profile=cpu-tiny",
         "selfcheck=0", f"records={RECORD}", "blocks=1", "port=18298", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp), "COMPBENCH_RUN_DIR": str(tmp / "run")})


def _urls(replicas: tuple[FakeProcess, FakeProcess]) -> str:
    return "replica_urls=" + ",".join(r.server_url for r in replicas)


def _routers(stderr: str) -> list[str]:
    return re.findall(r"vllm-router at (http://\S+) in front of", stderr)


def _gone(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.HTTPError:
        return True
    return False


def test_one_run_per_policy_and_the_comparison_beside_them(
        replicas: tuple[FakeProcess, FakeProcess], tmp_path: Path) -> None:
    done = bench(tmp_path, _urls(replicas), "router_policy=round_robin,consistent_hash",
                 "run_id=rt")
    assert done.returncode == 0, done.stderr[-3000:]
    homes: dict[str, dict[str, set[str]]] = {}
    for policy in ("round_robin", "consistent_hash"):
        run = tmp_path / f"rt-{policy}"
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["router"]["policy"] == policy
        assert manifest["router"]["replicas"] == [r.server_url for r in replicas]
        assert manifest["config"]["router_policy"] == [policy]
        assert manifest["fingerprint"]["router_policy"] == policy
        assert manifest["routing"] == {"base": "rt",
                                       "policies": ["round_robin", "consistent_hash"]}
        requests = read_jsonl(run / "requests.jsonl").objects
        assert {r["source"] for r in requests} == set(ARMS)
        assert all(r["status"] == "ok" for r in requests)
        lines = read_replica_lines(run)
        # the counters add up to the run's requests: the last scrape comes after the last one
        last = {line["replica"]: line for line in lines}
        first = {line["replica"]: line for line in reversed(lines)}
        finished = sum(last[u]["requests_finished"] - first[u]["requests_finished"]
                       for u in last)
        assert finished == len(requests), (finished, len(requests))
        found = infer_replicas(requests, lines)
        assert all(a.replica is not None for a in found.values()), found  # each ended alone
        homes[policy] = defaultdict(set)
        for r in requests:
            homes[policy][r["session_id"]].add(str(found[r["request_id"]].replica))
        assert "## Replicas behind the router" in (run / "report.md").read_text()
    # consistent hashing keeps each agent's session on one replica; round robin does not
    assert all(len(h) == 1 for h in homes["consistent_hash"].values()), homes
    assert set().union(*homes["round_robin"].values()) == {r.server_url for r in replicas}
    comparison = (tmp_path / "rt-routing.md").read_text()
    for arm in ARMS:
        rows = [line for line in comparison.splitlines()
                if line.startswith(f"| dedicated | {arm} |")]
        assert [row.split(" | ")[2] for row in rows] == ["round_robin", "consistent_hash"]
    assert comparison.count("| http://127.0.0.1:") == 4  # two replicas under each policy
    assert "routing comparison: " + str(tmp_path / "rt-routing.md") in done.stdout
    assert comparison.strip() in done.stdout  # printed as well as written
    routers = _routers(done.stderr)
    assert len(routers) == 2 and all(_gone(u) for u in routers)  # each stopped after its run


def test_a_failing_run_stops_its_router_and_no_replicas_is_one_line(
        replicas: tuple[FakeProcess, FakeProcess], tmp_path: Path) -> None:
    failed = bench(tmp_path, _urls(replicas), "router_policy=round_robin,random",
                   "run_id=bad", "records=no-such-record")
    assert failed.returncode != 0
    routers = _routers(failed.stderr)
    assert len(routers) == 1 and _gone(routers[0])  # stopped, and the next never started
    assert "no-such-record" in failed.stderr.strip().splitlines()[-1]
    none = bench(tmp_path, "router_policy=round_robin")
    assert none.returncode != 0
    last = none.stderr.strip().splitlines()[-1]
    assert "REPLICA_URLS=" in last and "make serve REPLICAS=2" in last, none.stderr[-2000:]


def test_a_sweep_through_a_router_samples_each_replica(
        replicas: tuple[FakeProcess, FakeProcess], tmp_path: Path) -> None:
    """A sweep (the fleet check's runs) records each replica's /metrics as blocks do: it had
    none, so its routing comparison said "no per-replica figures" for the plan's check."""
    done = bench(tmp_path, "regime=sweep", "arms=clean,external", "sweep.levels=2",
                 "sweep.min_continuations=2", "sweep.warmup=1", "tool_time=0",
                 "router_policy=round_robin", "run_id=swr", _urls(replicas))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = read_replica_lines(tmp_path / "swr-round_robin")
    assert {line["replica"] for line in lines} >= {r.server_url for r in replicas}, lines[:2]
    # the comparison pairs the measured continuations only (2 per arm), never the warm-ups
    # (cold cache) or drains (falling load)
    arms = [json.loads(x) for x in (tmp_path / "swr-round_robin" / "arms.jsonl").read_text()
            .splitlines() if x.strip()]
    assert {a["sweep_phase"] for a in arms} >= {"warmup", "measured"}
    row = next(x for x in (tmp_path / "swr-routing.md").read_text().splitlines()
               if x.startswith("| sweep | external | round_robin |"))
    assert "(n=2)" in row and "n=4" not in row, row
