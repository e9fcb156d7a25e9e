"""`compaction-bench bench` with replay arms (SOURCE=replay), through the real command against
the fake engine, whose replies are exactly `max_tokens` long: every recorded turn is sent, every
forced output comes back at its recorded length, the run folder and report say what was
replayed, the placebo is marked identical to clean, RESUME continues, bad names are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.common.paths import histories_root, repo_root
from compaction_bench.histories.format.history import load_history
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

pytestmark = pytest.mark.e2e

RECORDS = ("laguna-s-2.1__atcoder-abc400_b__rep-01__seed-1412000",
           "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=replay", "profile=cpu-tiny",
         f"base_url={url}", "selfcheck=0", f"records={','.join(RECORDS)}", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5)) as server:
        yield server


def recorded_lengths(record: str, arm: str) -> list[int]:
    history = load_history(histories_root() / "study" / record / f"{arm}.json")
    return [m["extra"]["usage"]["completion_tokens"] for m in history.continuation
            if m.get("role") == "assistant"]


def test_replay_blocks_send_every_recorded_turn_at_its_recorded_length(
        fake: FakeProcess, tmp_path: Path) -> None:
    done = bench(tmp_path, fake.api_url, "blocks=3", "run_id=rp",
                 "arms=clean,external,external-history,placebo")
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "rp"
    arms = lines(run / "arms.jsonl")
    assert len(arms) == 12 and all(a["status"] == "complete" for a in arms)
    # blocks take the records in turn; each arm replays its plan of the block's record
    assert [b["record"] for b in lines(run / "blocks.jsonl")] == [*RECORDS, RECORDS[0]]
    for a in arms:
        own = "external" if a["arm"] == "external" else "clean"
        assert a["source"] == "replay" and a["terminal_status"] == "Replayed"
        assert a["forced_requests"] == a["forced_exact"] == len(recorded_lengths(a["record"],
                                                                                 own))
        assert a["recorded_completion_tokens"] == sum(recorded_lengths(a["record"], own))
        assert a["continuation"] == ("history-only" if a["arm"] == "external-history"
                                     else "recorded")
    requests = [r for r in lines(run / "requests.jsonl") if r.get("source") == "external"]
    assert all(r["completion_tokens"] == r["labels"]["recorded_completion_tokens"]
               for r in requests)
    # one agent, one session: every request of an arm's block carries that arm's id
    assert {(r["block"], r["session_id"]) for r in requests} == {
        (b, f"dedicated-b{b}-external-original") for b in (1, 2, 3)}
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["source"] == "replay" and manifest["replay"]["records"] == list(
        RECORDS)
    assert manifest["config"]["side_by_side"] is False  # replay's default: one after another
    assert manifest["replay"]["served_prompt_counted"].startswith("estimated")  # no /tokenize
    # each replica's share of the host (serve.share): none recorded for a server the suite
    # did not start (tests/serve/test_share_e2e.py: one it did)
    assert [r["host_share"] for r in manifest["server"]["replicas"]] == [None]
    report = (run / "report.md").read_text()
    assert "## What was replayed, and whose time was measured" in report
    forced = sum(a["forced_requests"] for a in arms)
    assert f"forced outputs at exactly their recorded length: {forced}/{forced} (100.0%)" in (
        report)
    assert "## Where the change comes from: history and continuation" in report
    assert "placebo (identical to clean: nothing was compacted)" in report
    assert "external (identical to clean" not in report
    # the study's recorded branch was rewritten where it was recorded: its T_R is unknown here,
    # not 0 s (which would read as free)
    cost = next(line for line in report.splitlines()
                if line.startswith("| dedicated | external | per reasoning block"))
    assert "not measured here (a recorded branch" in cost and "0.0 s" not in cost
    assert "(= study)" in report  # the recorded figures reproduce the study's pair


def test_a_replay_run_resumes_where_it_stopped(fake: FakeProcess, tmp_path: Path) -> None:
    assert bench(tmp_path, fake.api_url, "blocks=1", "run_id=again").returncode == 0
    more = bench(tmp_path, fake.api_url, "resume=again", "blocks=2")
    assert more.returncode == 0, more.stderr[-2000:]
    blocks = lines(tmp_path / "again" / "blocks.jsonl")
    assert [b["block"] for b in blocks] == [1, 2] and blocks[1]["record"] == RECORDS[1]
    changed = bench(tmp_path, fake.api_url, "resume=again", "records=all")
    assert changed.returncode == ExitCode.USAGE and "not the same run" in changed.stderr


@pytest.mark.parametrize(("words", "needle"), [
    (("records=no-such-record",), "records: 'no-such-record' is no replay source"),
    (("source=agent", "arms=clean,external-history"), "exists only for replay"),
])
def test_bad_replay_settings_are_one_line(fake: FakeProcess, tmp_path: Path,
                                          words: tuple[str, ...], needle: str) -> None:
    done = bench(tmp_path, fake.api_url, *words)
    assert done.returncode == ExitCode.USAGE, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and needle in errors[0], done.stderr


def test_a_run_file_runs_a_block_and_the_manifest_keeps_the_resolved_settings(
        fake: FakeProcess, tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'source = "replay"\nprofile = "cpu-tiny"\nbase_url = "{fake.api_url}"\n'
                        f'selfcheck = false\nblocks = 1\nrecords = ["{RECORDS[1]}"]\n'
                        'arms = ["clean", "external"]\nrun_id = "from-file"\n')
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "--config", str(run_file), "seed=3"],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "from-file" / "manifest.json").read_text())
    config = manifest["config"]
    assert (config["seed"], config["blocks"], config["arms"]) == (3, 1, ["clean", "external"])
    assert config["records"] == [RECORDS[1]] and config["cache"] == "isolated"  # resolved
    assert len(lines(tmp_path / "from-file" / "arms.jsonl")) == 2


def test_repeat_runs_the_configuration_again_interleaved_and_reports_the_spread(
        fake: FakeProcess, tmp_path: Path) -> None:
    done = bench(tmp_path, fake.api_url, "blocks=1", "repeat=2", "run_id=rep",
                 "arms=clean,external")
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "rep"
    blocks = lines(run / "blocks.jsonl")
    # blocks per run x REPEAT, interleaved: both runs' block 1 replays record 1 with its seeds
    assert [b["block"] for b in blocks] == [1, 2]
    assert [b["record"] for b in blocks] == [RECORDS[0], RECORDS[0]]
    assert blocks[0]["seed"] == blocks[1]["seed"]
    salts = {a["block"]: a["cache_salt"] for a in lines(run / "arms.jsonl")
             if a["arm"] == "clean"}
    assert salts[1] != salts[2]  # each run's block has a cache of its own
    report = (run / "report.md").read_text()
    assert "## Between runs: the same configuration run 2 times (REPEAT=2)" in report
    row = next(line for line in report.splitlines() if line.startswith("| dedicated | external"))
    assert "points (" in row  # the spread of the two runs' medians
    assert "not the variation between runs, hosts or days" in report
    summary = json.loads((run / "summary.json").read_text())
    assert summary["repeat"] == 2 and summary["between_runs"][0]["n"] == [1, 1]
