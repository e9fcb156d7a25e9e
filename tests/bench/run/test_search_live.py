"""`make bench REGIME=search` against the fake engine with a known capacity, checked against a
full sweep on the same server: the fake admits two requests at a time (`max_running=2`, others
queue) and replays take no tool time, so a fleet of N agents takes about max(1, N/2) times as
long as one alone: at SLO p90:1.3x two agents meet it and three (about 1.5x) do not. The search
must find 2, and agree with the plan of a sweep of levels 1-4 within one level or inside the
sweep's interval (the README's statement); a resumed search runs no cell again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

pytestmark = pytest.mark.e2e

RECORD = "laguna-s-2.1__atcoder-abc400_a__rep-01__seed-1411000"  # 2 turns, 163 tokens
SLO = "p90:1.3x"
TRUE_CAPACITY = 2


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def command(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", *args], cwd=repo_root(), capture_output=True,
        text=True, timeout=600, check=False, env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


def bench(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return command(tmp, "bench", "source=replay", "profile=cpu-tiny", f"base_url={url}",
                   "selfcheck=0", f"records={RECORD}", "arms=clean,external", "tool_time=0",
                   *args)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=3, max_running=2)) as server:
        yield server


def test_search_finds_the_known_capacity_and_agrees_with_a_full_sweep(
        fake: FakeProcess, tmp_path: Path) -> None:
    searched = bench(tmp_path, fake.api_url, "regime=search", f"slo={SLO}",
                     "search.max_level=6", "search.confirm_continuations=16", "run_id=s")
    assert searched.returncode == 0, searched.stderr[-3000:]
    run = tmp_path / "s"
    records = lines(run / "search.jsonl")
    results = {r["arm"]: r for r in records if r["kind"] == "result"}
    decisions = [r for r in records if r["kind"] == "decision"]
    assert set(results) == {"clean", "external"}
    for arm, result in results.items():
        assert result["agents"] == TRUE_CAPACITY, (arm, result, searched.stderr[-3000:])
        assert result["unbounded_up_to"] is None and result["confirmed"] == [2, 3]
        own = [(d["step"], d["level"]) for d in decisions if d["arm"] == arm]
        assert own == [("probe", 1), ("probe", 2), ("probe", 4), ("bisect", 3),
                       ("confirm", 2), ("confirm", 3)]
    for d in decisions:
        assert d["n"] + d["failed"] >= (16 if d["step"] == "confirm" else 8)
        assert d["quantile"] == "p90" and d["limit_s"] > 0 and d["why"]
        assert d["held"] == (d["quantile_s"] <= d["limit_s"])
    # the cells are sweep cells: the confirmation is its cell's next pass, the plan's
    cells = lines(run / "sweep.jsonl")
    assert {(c["arm"], c["level"], c["cell_pass"], c["search_step"]) for c in cells} >= {
        ("clean", 2, 2, "confirm"), ("clean", 3, 2, "confirm"), ("clean", 4, 1, "probe")}
    assert "clean: 2 agents" in searched.stderr
    # every external cell's invariant was checked against clean's history, never itself
    external = [a["invariant"] for a in lines(run / "arms.jsonl") if a["arm"] == "external"]
    assert external and all(i["clean_sha256"] != i["arm_sha256"] for i in external), external[0]

    swept = bench(tmp_path, fake.api_url, "regime=sweep", "sweep.levels=1,2,3,4", "run_id=w")
    assert swept.returncode == 0, swept.stderr[-3000:]
    planned = command(tmp_path, "plan", str(tmp_path / "w"), f"slo={SLO}", "bootstrap=300")
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = json.loads((tmp_path / "w" / "plan.json").read_text())
    for arm, result in results.items():
        figure = plan["arms"][arm]["agents_per_gpu"]
        low, high = figure["ci"]
        within_one = abs(result["agents"] - figure["value"]) <= 1
        inside = low <= result["agents"] <= (high if high is not None else float("inf"))
        assert within_one or inside, (arm, result, figure)

    resumed = bench(tmp_path, fake.api_url, "regime=search", "resume=s")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "12 cells already done" in resumed.stderr
    assert lines(run / "sweep.jsonl") == cells  # nothing ran again
    again = [r for r in lines(run / "search.jsonl") if r["kind"] == "result"]
    assert [r["agents"] for r in again[-2:]] == [TRUE_CAPACITY] * 2
    assert len([r for r in lines(run / "search.jsonl") if r["kind"] == "decision"]) == len(
        decisions)
