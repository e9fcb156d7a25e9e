"""`make bench REGIME=sweep` then `make plan` against the real vLLM CPU server: a short sweep
(levels 1 and 2, two measured continuations per cell, two model calls per continuation) whose
records the planner turns into a plan with the kernels' CPU cost model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.serve.launcher import Server

pytestmark = pytest.mark.integration
ROOT = repo_root()
CPU_COSTS = ("data/kernels/"
             "cpu-intel-xeon-processor-2c__smollm2-135m-instruct__vllm-0.32.0.json")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_short_sweep_and_its_plan(cpu_server: Server, tmp_path: Path) -> None:
    env = {**os.environ, "COMPBENCH_RESULTS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "regime=sweep",
         "profile=cpu-tiny", "source=agent",
         f"base_url={cpu_server.api_url}", "arms=clean,self", "sweep.levels=1,2",
         "sweep.min_continuations=2", "step_limit=2", "selfcheck=0",
         "run_id=sw"], cwd=ROOT, capture_output=True, text=True, timeout=900,
        check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[sweep] done: make plan RUN=sw" in done.stderr
    run = tmp_path / "sw"
    arms = lines(run / "arms.jsonl")
    cells = lines(run / "sweep.jsonl")
    assert sorted((c["arm"], c["level"]) for c in cells) == [
        ("clean", 1), ("clean", 2), ("self", 1), ("self", 2)]
    assert all(c["status"] == "done" and c["continuations"]["measured"] == 2 for c in cells)
    for level in (1, 2):
        for arm in ("clean", "self"):
            own = [a for a in arms if a["arm"] == arm and a["level"] == level]
            assert sum(a["sweep_phase"] == "warmup" for a in own) == level
            assert sum(a["sweep_phase"] == "measured" for a in own) == 2
            assert all(a["status"] == "complete" and a["regime"] == "sweep" for a in own), own
    # a fresh seed per continuation, and the same one for both arms' (level, agent, index)
    seeds = {(a["arm"], a["level"], a["sweep_agent"], a["sweep_index"]): a["seed"] for a in arms}
    assert len({s for (arm, *_), s in seeds.items() if arm == "clean"}) == len(
        [k for k in seeds if k[0] == "clean"])
    assert all(seeds[("self", *k[1:])] == s for k, s in seeds.items()
               if k[0] == "clean" and ("self", *k[1:]) in seeds)
    requests = [r for r in lines(run / "requests.jsonl") if r["source"] in ("clean", "self")]
    assert requests and all(r["labels"]["level"] in (1, 2) for r in requests)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["sweep"]["levels"] == [1, 2]
    assert manifest["sweep"]["server_cache_config"]["block_size"] == "128"

    planned = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "plan", str(run), f"costmodel={CPU_COSTS}",
         "bootstrap=300"], cwd=ROOT, capture_output=True, text=True, timeout=300,
        check=False, env=env)
    assert planned.returncode == 0, planned.stderr
    document = json.loads((run / "plan.json").read_text())
    # the server's own KV pool (its blocks x their size: 93,184 tokens in bfloat16 on the
    # AVX-512 machine, half that in float32 on the AVX2 one), not a figure fixed here
    cache = manifest["sweep"]["server_cache_config"]
    assert document["engine"]["kv_pool_tokens"] == int(cache["num_gpu_blocks"]) * int(
        cache["block_size"]) and not document["engine"]["model_reasons"]
    for arm in ("clean", "self"):
        entry = document["arms"][arm]
        capacity = entry["agents_per_gpu"]  # a number, or past the plan's reach named
        assert (capacity["value"] is not None and capacity["value"] >= 0) or (
            capacity["value"] is None and capacity["beyond_measured_range"] == 4), capacity
        assert capacity["binding"]
        assert 0 < entry["agents_per_gpu"]["duty"] <= 1
        assert [lv["n"] for lv in entry["levels"]] == [2, 2]
        simulated = document["simulation"]["arms"][arm]
        assert [lv["level"] for lv in simulated["levels"]] == [1, 2, 4, 8]
        assert simulated["mape_pct"] is not None
    assert {b["condition"] for b in document["breakeven"]} == {"sweep N=1", "sweep N=2"}
    text = (run / "plan.md").read_text()
    assert "demonstrates the method, not the effect" in text
    assert (run / "plots" / "plan_curve.png").is_file()
