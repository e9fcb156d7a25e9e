"""The reasoning-only invariant of an arm run alone (a recovery run, a sweep cell) is checked
against clean's history, or recorded as not checked; never as passed against the arm itself
(issue 22: `reference = clean or arm` compared such an arm with its own first request). A real
block (`run_block`, the real agent loop and workspace) against the fake server."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from compaction_bench.bench.run.agent_source import AgentSource
from compaction_bench.bench.run.arm import Arm, arm_for
from compaction_bench.bench.run.block import NO_CLEAN, BlockSettings, run_block
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.common.paths import histories_root, repo_root
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import History, load_history
from compaction_bench.histories.policies.base import CleanPolicy
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.profile import load_profile

pytestmark = pytest.mark.e2e

LS = "THOUGHT: List the files.\n\n```bash\nls\n```"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, default_content=LS)) as server:
        yield server


def tampered(clean: History) -> Arm:
    """An arm whose history differs from clean's outside reasoning: the task's user message."""
    data = copy.deepcopy(clean.to_json())
    user = next(m for m in data["messages"] if m["role"] == "user")
    user["content"] = user["content"] + "\nAlso rewrite the README."
    return Arm("tampered", History.from_json(data, origin="test"), lambda _: CleanPolicy())


def test_an_arm_alone_is_checked_against_clean_or_recorded_as_not_checked(
        fake: FakeProcess, tmp_path: Path) -> None:
    task = load_task("fix-median")
    history = load_history(histories_root() / "fix-median" / "clean.json")
    clean = arm_for("clean", history, compressors={})
    config = BenchConfig(regime="dedicated", task=task.id, arms=("clean",), step_limit=1)
    settings = BlockSettings(
        config=config, run_id="inv", source=AgentSource(config, task),
        model=config_for_profile(load_profile("cpu-tiny"), fake.api_url, seed=5),
        protocol="lenient", block_size=16, ledger=Ledger())
    writer = RunWriter(tmp_path, origin=0.0)
    arm = tampered(history)

    def alone(block: int, reference: Arm | None) -> dict[str, object]:
        (record,) = run_block([arm], settings=settings, regime="dedicated", block=block,
                              rng=np.random.default_rng(0), writer=writer, attempt="recovery",
                              reference=reference).records
        return {"status": record.status, "phase": record.error_phase, "error": record.error,
                "invariant": record.invariant}

    unchecked = alone(1, None)  # no clean in this run: said so, not "passed"
    assert unchecked["invariant"] == {"passed": None, "checked": False, "not_checked": NO_CLEAN}
    assert unchecked["phase"] != "invariant", unchecked["error"]
    checked = alone(2, clean)  # against clean's real history: the changed user message shows
    assert checked["status"] == "failed" and checked["phase"] == "invariant", checked["error"]
    invariant = checked["invariant"]
    assert isinstance(invariant, dict) and invariant["passed"] is False
    assert invariant["clean_sha256"] != invariant["arm_sha256"]
    assert str(checked["error"]).startswith("InvariantError:")


def test_a_sweep_cell_checks_its_arm_against_clean(fake: FakeProcess, tmp_path: Path) -> None:
    """Through the real `bench regime=sweep`: a placebo cell's continuation is checked against
    clean's first request of the same continuation number (its body, clean's seed), which is
    the one clean's cell sent; before, placebo was checked against itself."""
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "regime=sweep", "source=agent",
         "profile=cpu-tiny", f"base_url={fake.api_url}", "arms=clean,placebo",
         "sweep.levels=1", "sweep.min_continuations=1", "sweep.warmup=0", "step_limit=1",
         "selfcheck=0", "run_id=sw"], cwd=repo_root(), capture_output=True, text=True,
        timeout=600, check=False, env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    arms = [json.loads(line) for line in (tmp_path / "sw" / "arms.jsonl").read_text()
            .splitlines() if line.strip()]
    clean = {a["block"]: a["invariant"] for a in arms if a["arm"] == "clean"}
    placebo = {a["block"]: a["invariant"] for a in arms if a["arm"] == "placebo"}
    assert placebo and set(placebo) == set(clean)
    for block, invariant in placebo.items():
        assert invariant["passed"] is True and "seed" in invariant["factor_fields"]
        assert invariant["clean_sha256"] == clean[block]["arm_sha256"] != (
            invariant["arm_sha256"])


def bench(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={url}", f"external_url={url}", "step_limit=3", "selfcheck=0", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


def test_a_recovery_run_checks_its_arm_against_clean(tmp_path: Path) -> None:
    """Through the real `bench ... recover=1`: a failed placebo re-run alone is checked against
    clean's history (clean's body, clean's seed), not against its own first request."""
    # a path git reserves: the host-side patch capture fails every arm (test_trust.py)
    broken = "THOUGHT: Break the patch.\n\n```bash\nmkdir .GIT && echo x > .GIT/x\n```"
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, default_content=broken)) as server:
        first = bench(tmp_path, server.api_url, "blocks=1", "arms=clean,placebo", "run_id=rec")
    assert first.returncode == 0, first.stderr
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, default_content=LS)) as server:
        again = bench(tmp_path, server.api_url, "resume=rec", "recover=1")
    assert again.returncode == 0, again.stderr
    arms = [json.loads(line) for line in (tmp_path / "rec" / "arms.jsonl").read_text()
            .splitlines() if line.strip()]
    recovered = {a["arm"]: a for a in arms if a["attempt"] == "recovery"}
    assert set(recovered) == {"clean", "placebo"}, [(a["arm"], a["attempt"]) for a in arms]
    placebo = recovered["placebo"]["invariant"]
    assert placebo["passed"] is True and "seed" in placebo["factor_fields"]
    assert placebo["clean_sha256"] == recovered["clean"]["invariant"]["arm_sha256"] != (
        placebo["arm_sha256"])
