"""Replay on the real vLLM CPU server: the recorded turns of one study record, forced to their
recorded lengths with min_tokens/max_tokens/ignore_eos, come back at exactly those lengths, and
the compacted history reaches the model (its served prompt is shorter than clean's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.serve.launcher import Server

pytestmark = pytest.mark.integration

RECORD = "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000"


def test_one_replay_block_on_the_real_server(cpu_server: Server, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "profile=cpu-tiny",
         f"base_url={cpu_server.api_url}", "selfcheck=0", "blocks=1", f"records={RECORD}",
         "run_id=live"], cwd=repo_root(), capture_output=True, text=True, timeout=900,
        check=False, env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "live"
    arms = {a["arm"]: a for a in map(json.loads, (run / "arms.jsonl").read_text().splitlines())}
    assert set(arms) == {"clean", "external", "external-history"}  # replay's default arms
    for arm in arms.values():
        assert arm["status"] == "complete" and arm["source"] == "replay", arm
        assert arm["forced_exact"] == arm["forced_requests"] == 2, arm
    # served prompts: the compacted history is shorter on this server too, and the
    # history-only arm sends exactly the external arm's first request history
    assert arms["external"]["history_tokens"] < arms["clean"]["history_tokens"]
    assert arms["external-history"]["history_tokens"] == arms["external"]["history_tokens"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["replay"]["served_prompt_counted"] == "the server's /tokenize"
    served = manifest["replay"]["served_prompt_tokens"][RECORD]
    assert served["clean"][0] == arms["clean"]["history_tokens"]  # the fit saw what was sent
    report = (run / "report.md").read_text()
    assert "forced outputs at exactly their recorded length: 6/6 (100.0%)" in report
