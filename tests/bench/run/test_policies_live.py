"""The second paper's arms end to end against the real vLLM CPU server: one block of every policy
arm with a run-scoped cache, each arm's invariant checked and its ledger written, and every
request's predicted cached tokens within one KV block of what the server measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.serve.launcher import Server

pytestmark = pytest.mark.integration
ARMS = ["clean", "entropy", "step-entropy", "delete-all-thinking", "keep-latest", "random-30"]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_policy_arms_run_with_ledgers_and_exact_cache_accounting(cpu_server: Server,
                                                                 tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={cpu_server.api_url}", "arms=" + ",".join(ARMS), "blocks=1", "step_limit=3",
         "cache=run", "selfcheck=0", "run_id=policies"], cwd=repo_root(),
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "policies"
    arms = {a["arm"]: a for a in lines(run / "arms.jsonl")}
    assert sorted(arms) == sorted(ARMS)
    assert all(a["status"] == "complete" and a["invariant"]["passed"] for a in arms.values())
    salts = {a["cache_salt"] for a in arms.values()}
    assert len(salts) == 1  # one salt for the whole run, its own: not the reusable run id
    assert salts.pop().startswith("policies-")
    ledger = [e for e in lines(run / "ledger.jsonl") if e.get("kind") == "policy"]
    # Each step the continuation kept is decided at the next request (keep-latest: the fork's
    # own turn at the first request after a later step). A turn SmolLM2 answers off-protocol
    # (a FormatError, e.g. cut at 256 tokens) adds no assistant step, so with format errors an
    # arm decides fewer steps; without them it decides exactly turns - 1.
    decided = Counter(e["policy"] for e in ledger)
    for name in set(ARMS) - {"clean"}:
        arm = arms[name]
        assert decided[name] <= arm["turns"] - 1, (name, decided, arm["turns"])
        if arm["format_errors"] == 0:
            assert decided[name] == arm["turns"] - 1, (name, decided, arm["turns"])
    assert sum(decided.values()) > 0
    assert all(e["context"]["phase"] == "continuation" for e in ledger)
    if decided["entropy"]:
        assert {e["outcome"] for e in ledger if e["policy"] == "entropy"} == {"single-segment"}
    requests = [r for r in lines(run / "requests.jsonl") if r["source"] in ARMS]
    assert requests and all("kv_prefix" in r["labels"] for r in requests)
    summary = json.loads((run / "summary.json").read_text())
    cache = summary["cache_accounting"]
    assert cache["block_size"] == 128 and cache["checked"] == len(requests)
    assert cache["disagreements"] == [] and cache["unchecked"] == 0
    by_arm = {a["arm"]: a for a in cache["arms"]}
    assert by_arm["delete-all-thinking"]["n_agree"] == by_arm["delete-all-thinking"]["n_checked"]
    assert by_arm["clean"]["loss_old_text"] == 0  # clean never rewrites what it sent
    # the block's own verdicts first: an invalid block (its load checks, e.g. a machine busy
    # with other work) leaves the comparison without a pair, and this names why (a reverse-order
    # tier run beside other tests once failed below with n == 0 and no reason shown)
    (block,) = lines(run / "blocks.jsonl")
    assert block["invalid_reasons"] == [], block["invalid_reasons"]
    policies = summary["policies"]["dedicated"]["arms"]
    assert set(policies) == set(ARMS) - {"clean"} and policies["entropy"]["postfork_s"]["n"] == 1
    report = (run / "report.md").read_text()
    assert "## Policy comparison" in report and "## Cache-break accounting" in report
    assert "(plots/policy_pareto.png)" in report
