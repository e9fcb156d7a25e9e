"""Blocks you can trust, through the real `bench.cli run` against the fake server (where the
truth must be known exactly): independent repeats with recorded seeds, every arm's failure on
record, compressor traffic recorded, the invariant on the body sent, arms released together,
RESUME refusing a changed run and re-running a block a crash cut short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

pytestmark = pytest.mark.e2e

# A text-protocol turn whose thought is longer than the identity rule (12 words), so the compact
# arms send it to their compressor before the next request; `ls` keeps the agent going.
LONG_LS = ("THOUGHT: I will list the files of this repository to find the module that holds "
           "the median function.\n\n```bash\nls\n```")
# a path git reserves: the host-side patch capture cannot hold it and fails the arm (removing
# .git no longer breaks a capture that never reads the agent's repository)
RESERVED = "THOUGHT: Break the patch.\n\n```bash\nmkdir .GIT && echo x > .GIT/x\n```"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench(tmp: Path, url: str, *args: str, compressor: str | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={url}",
         f"external_url={compressor or url}", "step_limit=3", "selfcheck=0", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp), **(env or {})})


@pytest.fixture
def target() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1, default_content=LONG_LS)) as fake:
        yield fake


def test_blocks_are_independent_repeats_with_recorded_seeds(target: FakeProcess,
                                                            tmp_path: Path) -> None:
    done = bench(tmp_path, target.api_url, "blocks=3", "arms=clean,placebo",
                 "run_id=seeds")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "seeds"
    arms = lines(run / "arms.jsonl")
    seeds = {(a["block"], a["arm"]): a["seed"] for a in arms}
    assert len({seeds[(b, "clean")] for b in (1, 2, 3)}) == 3  # blocks differ
    # SEEDS=common, yet the placebo has its own stream and its own cache (an A/A, issue 22)
    assert all(seeds[(b, "clean")] != seeds[(b, "placebo")] for b in (1, 2, 3))
    salts = {(a["block"], a["arm"]): a["cache_salt"] for a in arms}
    assert all(salts[(b, "placebo")] not in (None, salts[(b, "clean")]) for b in (1, 2, 3))
    requests = [r for r in lines(run / "requests.jsonl") if r["source"] in ("clean", "placebo")]
    by_arm_block: dict[tuple[int, str], list[int]] = {}
    for r in requests:
        by_arm_block.setdefault((r["block"], r["source"]), []).append(r["labels"]["seed"])
    for key, sent in by_arm_block.items():  # request k sends seed + k
        assert sorted(sent) == [seeds[key] + k for k in range(len(sent))]
    # the invariant was checked on the very body each arm sent first
    first = {}
    for r in requests:
        first.setdefault((r["block"], r["source"]), r["labels"]["body_sha256"])
    for a in arms:
        assert a["invariant"]["passed"] and a["invariant"]["arm_sha256"] == first[
            (a["block"], a["arm"])]
    # released together after setup: every first request after the release, close together
    for block in lines(run / "blocks.jsonl"):
        starts = [a["first_request_s"] for a in arms if a["block"] == block["block"]]
        assert min(starts) >= block["released_s"] and max(starts) - min(starts) < 1.0
        # the block's seed is the one its arms sampled with (issue 22: it was another)
        assert block["seed"] == seeds[(block["block"], "clean")] and block["load"]["users"] == 0
    summary = json.loads((run / "summary.json").read_text())
    placebo = summary["regimes"]["dedicated"]["arms"]["placebo"]
    # 3 blocks: no interval (none covers 95% below 6); the false-positive rate at this n
    assert placebo["blocks_complete"] == 3 and placebo["ci_low_pct"] is None
    assert set(summary["noise"]["false_positive"]) == {"3"}
    report = (run / "report.md").read_text()
    assert "## What these numbers can say" in report and "Placebo arm" in report
    for b in (1, 2, 3):  # the report shows each block's seeds: the placebo's its own
        assert f"clean {seeds[(b, 'clean')]}, placebo {seeds[(b, 'placebo')]}" in report
    # the harness's own share: every block at least as long as its slowest arm, and the
    # invocation's wall time split into server start, blocks and the rest
    phases = {p["phase"] for p in lines(run / "phases.jsonl")}
    assert {"server_start", "selfcheck", "service_probe", "invocation"} <= phases
    harness = summary["harness"]
    assert len(harness["blocks"]) == 3 and all(b["ratio"] >= 1.0 for b in harness["blocks"])
    (invocation,) = harness["invocations"]
    assert invocation["blocks"] == 3 and invocation["wall_s"] >= invocation["blocks_s"] > 0
    assert "harness share per block" in report and "harness outside server start" in report

    independent = bench(tmp_path, target.api_url, "blocks=1", "arms=clean,placebo",
                        "seeds=independent", "cache=isolated", "run_id=indep")
    assert independent.returncode == 0, independent.stderr
    per_arm = {a["arm"]: a["seed"] for a in lines(tmp_path / "indep" / "arms.jsonl")}
    assert per_arm["clean"] != per_arm["placebo"]
    # an isolated cache: a salt per arm, attempt and block pass, unique to this run's clock
    salts = {a["arm"]: a["cache_salt"] for a in lines(tmp_path / "indep" / "arms.jsonl")}
    assert salts["clean"] != salts["placebo"] and all(
        s.startswith("indep-") and "-b1-p1-" in s and s.count("-") >= 5 for s in salts.values())
    assert all(a["invariant"]["factor_fields"] == ["cache_salt", "seed"]  # the two factors
               for a in lines(tmp_path / "indep" / "arms.jsonl") if a["arm"] == "placebo")


def test_stopping_the_external_compressor_fails_the_arm_with_a_reason(
        target: FakeProcess, tmp_path: Path) -> None:
    compressor = FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1,
                                        default_content="Files listed; find median.")).start()
    run = tmp_path / "comp"
    process = subprocess.Popen(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={target.api_url}", f"external_url={compressor.api_url}", "step_limit=3",
         "selfcheck=0",
         "blocks=3", "arms=clean,external", "run_id=comp"],
        cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the compressor has answered: now it goes away
        path = run / "requests.jsonl"
        if path.exists() and '"external/compressor"' in path.read_text():
            break
        time.sleep(0.05)
    compressor.stop()
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    arms = lines(run / "arms.jsonl")
    failed = [a for a in arms if a["arm"] == "external" and a["status"] == "failed"]
    assert failed, arms
    assert failed[0]["error_phase"] == "policy" and "compressor failed" in failed[0]["error"]
    assert failed[0]["rewrite_failed_blocks"] >= 1
    compressed = [r for r in lines(run / "requests.jsonl") if r["source"] == "external/compressor"]
    assert compressed and all(r["block"] in (1, 2, 3) and r["labels"]["attempt"] == "original"
                              for r in compressed)
    assert any(r["status"] == "ok" for r in compressed)
    assert any(r["status"] == "error" for r in compressed)
    ledger = lines(run / "ledger.jsonl")
    assert ledger and all(e["context"]["arm"] == "external" and "block" in e["context"]
                          and e["t_s"] > 0 for e in ledger)
    summary = json.loads((run / "summary.json").read_text())
    unusable = summary["regimes"]["dedicated"]["blocks_unusable"]
    assert any("arm external failed: PolicyError" in "; ".join(u["reasons"]) for u in unusable)


def test_a_broken_workspace_leaves_a_failed_record_and_recovery_reruns_it(
        tmp_path: Path) -> None:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1, default_content=RESERVED)) as fake:
        done = bench(tmp_path, fake.api_url, "blocks=1", "arms=clean",
                     "run_id=git")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "git"
    (arm,) = lines(run / "arms.jsonl")
    assert arm["status"] == "failed" and arm["error_phase"] == "patch"
    assert "patch capture" in arm["error"] and arm["postfork_s"] > 0
    assert len(lines(run / "blocks.jsonl")) == 1
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1, default_content=LONG_LS)) as fake:
        again = bench(tmp_path, fake.api_url, "resume=git", "recover=1")
    assert again.returncode == 0, again.stderr
    attempts = [(a["attempt"], a["status"]) for a in lines(run / "arms.jsonl")]
    assert attempts == [("original", "failed"), ("recovery", "complete")]


def test_resume_refuses_a_changed_run(target: FakeProcess, tmp_path: Path) -> None:
    assert bench(tmp_path, target.api_url, "blocks=1", "arms=clean",
                 "run_id=same").returncode == 0
    changed = bench(tmp_path, target.api_url, "resume=same", "task=fix-slugify",
                    "arms=clean")
    assert changed.returncode == ExitCode.USAGE
    (line,) = [x for x in changed.stderr.splitlines() if x.strip()]
    assert line.startswith("error: cannot resume same: this is not the same run:")
    assert "task (run: 'fix-median', now: 'fix-slugify')" in line
    assert "history files of clean changed" in line


def test_a_block_a_crash_cut_short_runs_again_as_a_new_pass(target: FakeProcess,
                                                          tmp_path: Path) -> None:
    assert bench(tmp_path, target.api_url, "blocks=1", "arms=clean,placebo",
                 "run_id=cut").returncode == 0
    run = tmp_path / "cut"
    (run / "blocks.jsonl").write_text("")  # as if the bench died before closing the block...
    kept = (run / "arms.jsonl").read_text().splitlines()[:1]  # ...with one arm on record
    (run / "arms.jsonl").write_text(kept[0] + "\n")
    again = bench(tmp_path, target.api_url, "resume=cut")
    assert again.returncode == 0, again.stderr
    arms = lines(run / "arms.jsonl")
    assert [a.get("block_pass") for a in arms] == [None, 2, 2]
    (block,) = lines(run / "blocks.jsonl")
    assert block["block_pass"] == 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["regimes"]["dedicated"]["blocks_complete"] == 1  # the last pass only


@pytest.mark.parametrize(("protocol", "status"), [("strict", "failed"), ("lenient", "complete")])
def test_the_first_protocol_error_fails_a_strict_arm(tmp_path: Path, protocol: str,
                                                     status: str) -> None:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1, default_content=LONG_LS)) as fake:
        fake.script([{"content": "I forgot the action block."}])
        done = bench(tmp_path, fake.api_url, "blocks=1", "arms=clean",
                     f"protocol={protocol}", f"run_id={protocol}")
    assert done.returncode == 0, done.stderr
    (arm,) = lines(tmp_path / protocol / "arms.jsonl")
    assert arm["status"] == status and arm["protocol"] == protocol and arm["format_errors"] == 1
    if status == "failed":
        assert arm["error"].startswith("ProtocolError: 1 protocol error(s) after the fork")
