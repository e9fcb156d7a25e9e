"""`make bench LOCUST_REMOTE_WORKERS=n LOCUST_MASTER=HOST:PORT`: the settings are refused without
the master's address; a real bench on the fake engine waits for a worker started by hand with the
command it prints, and its run says (report and summary) that the worker's records are missing
until `compaction-bench load merge` brings them in, each exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.files import read_jsonl
from compaction_bench.common.net import free_port
from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

RECORD = "laguna-s-2.1__atcoder-abc400_b__rep-01__seed-1412000"
CLI = [sys.executable, "-m", "compaction_bench"]


def test_remote_workers_without_a_master_address_are_refused_naming_the_fix() -> None:
    with pytest.raises(ValidationError) as caught:
        BenchConfig(locust_remote_workers=2)
    message = str(caught.value)
    assert "LOCUST_REMOTE_WORKERS=2 needs LOCUST_MASTER=HOST:PORT" in message
    assert "LOCUST_MASTER=0.0.0.0:5557" in message
    with pytest.raises(ValidationError, match="LOCUST_MASTER=host-a: give HOST:PORT"):
        BenchConfig(locust_remote_workers=1, locust_master="host-a")
    # the master binds what the user gives, nothing by default
    assert BenchConfig().locust_master is None
    assert BenchConfig(locust_remote_workers=1,
                       locust_master="10.0.0.5:5557").locust_master == "10.0.0.5:5557"


@pytest.mark.e2e
def test_the_command_line_refuses_them_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "bench", "LOCUST_REMOTE_WORKERS=1"], capture_output=True,
                          text=True, timeout=120, cwd=repo_root(),
                          env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "needs LOCUST_MASTER=HOST:PORT" in last


@pytest.mark.e2e
def test_a_remote_workers_records_are_missing_visibly_until_merged_once(tmp_path: Path) -> None:
    port = free_port()
    host_b = tmp_path / "host-b"
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5)) as fake:
        bench = subprocess.Popen(
            [*CLI, "bench", "source=replay", "profile=cpu-tiny", f"base_url={fake.api_url}",
             "selfcheck=0", f"records={RECORD}", "regime=shared", "blocks=1", "run_id=rw",
             "locust_remote_workers=1", f"locust_master=127.0.0.1:{port}"],
            cwd=repo_root(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "COMPBENCH_RESULTS": str(tmp_path)})
        worker: subprocess.Popen[bytes] | None = None
        seen: list[str] = []
        try:
            assert bench.stderr is not None
            for line in bench.stderr:
                seen.append(line)
                if "start each on its host with: " in line:
                    break
            else:
                pytest.fail("the bench never said how to start the worker:\n" + "".join(seen))
            # the exact command it printed, this host's folder in place of its suggestion
            command = line.split("start each on its host with: ", 1)[1].split()
            assert command[:4] == ["compaction-bench", "load", "worker",
                                   f"master=127.0.0.1:{port}"] and command[4].startswith("out=")
            assert "waiting up to 600 s for 1 remote worker(s)" in line
            with (tmp_path / "worker.log").open("wb") as log:
                worker = subprocess.Popen([*CLI, *command[1:4], f"out={host_b}"], stdout=log,
                                          stderr=subprocess.STDOUT)
                rest = bench.communicate(timeout=400)[1]
                assert bench.returncode == 0, "".join(seen)[-2000:] + rest[-3000:]
                assert worker.wait(timeout=60) == 0  # the master's quit ended it cleanly
        finally:
            for process in (bench, worker):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
    run = tmp_path / "rw"
    assert f"load merge {run} DIR... workers=1; then make report RUN=rw" in rest
    remote = read_jsonl(next(host_b.glob("requests-*.jsonl"))).objects
    assert remote  # the worker sent requests, on its host only so far
    assert not [r for r in read_jsonl(run / "requests.jsonl").objects
                if r["source"] == "background"]
    report = (run / "report.md").read_text()
    assert "1 of 1 remote workers' background records are not merged yet" in report
    assert f"compaction-bench load merge {run} DIR... workers=1" in report
    summary = json.loads((run / "summary.json").read_text())
    assert summary["background_remote_workers"] == {"expected": 1, "merged": 0, "pending": 1}

    merged = subprocess.run([*CLI, "load", "merge", str(run), str(host_b), "workers=1"],
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert [m["remote"] for m in read_jsonl(run / "background" / "merges.jsonl").objects] == [
        True]
    report_again = subprocess.run([*CLI, "report", str(run)], capture_output=True, text=True,
                                  timeout=300)
    assert report_again.returncode == 0, report_again.stderr
    background = [r for r in read_jsonl(run / "requests.jsonl").objects
                  if r["source"] == "background"]
    ids = sorted(r["request_id"] for r in background)
    assert ids == sorted(r["request_id"] for r in remote)  # each exactly once
    assert len(set(ids)) == len(ids)
    assert "not merged yet" not in (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["background_remote_workers"] == {"expected": 1, "merged": 1, "pending": 0}
