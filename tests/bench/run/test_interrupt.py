"""Fault injection (the one place a fake server is right): the server dies mid-block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction_bench.bench.run.stop import SIGNALS, RunStop
from compaction_bench.common.net import free_port
from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

pytestmark = pytest.mark.e2e


def bench(tmp: Path, url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={url}",
         "arms=clean", "step_limit=4", "selfcheck=0", *args],
        cwd=repo_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


def test_killed_server_keeps_records_and_resume_continues(tmp_path: Path) -> None:
    port = free_port()
    # slow tokens: each model request takes ~2 s, so the arm is mid-flight when the server dies
    config = FakeConfig(port=port, ttft_ms=200, itl_ms=30, tokens=60)
    fake = FakeProcess(config).start()
    run = bench(tmp_path, fake.api_url, "regime=dedicated", "blocks=2",
                "run_id=killed")
    requests_file = tmp_path / "killed" / "requests.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until one request has finished, then kill
        if requests_file.exists() and any(
                json.loads(line).get("status") == "ok"
                for line in requests_file.read_text().splitlines() if line.endswith("}")):
            break
        time.sleep(0.2)
    time.sleep(0.5)
    fake.stop()  # the server goes away in the middle of block 1
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 1, out
    assert "stopped answering during block 1" in out and "RESUME=killed" in out
    run_dir = tmp_path / "killed"
    arms = [json.loads(line) for line in (run_dir / "arms.jsonl").read_text().splitlines()]
    assert len(arms) == 1 and arms[0]["status"] == "failed"
    assert arms[0]["error"].startswith("TransportError") and arms[0]["postfork_s"] > 1
    requests = (run_dir / "requests.jsonl").read_text().splitlines()
    assert any(json.loads(r)["status"] == "ok" for r in requests)  # finished ones kept
    assert (run_dir / "report.md").is_file()  # the report says what could not be used

    fake = FakeProcess(FakeConfig(port=port, ttft_ms=20, itl_ms=2, tokens=60)).start()
    try:
        resumed = bench(tmp_path, fake.api_url, "regime=dedicated", "resume=killed")
        out, _ = resumed.communicate(timeout=300)
    finally:
        fake.stop()
    assert resumed.returncode == 0, out
    arms = [json.loads(line) for line in (run_dir / "arms.jsonl").read_text().splitlines()]
    # the block the server died in was left open: it runs again in full as its second pass,
    # and the first pass's record stays (the analysis reads only a block's last pass)
    assert [(a["block"], a["block_pass"]) for a in arms] == [(1, None), (1, 2), (2, None)]
    assert arms[0]["status"] == "failed"
    assert [a["status"] for a in arms[1:]] == ["complete", "complete"]
    # the fake's text is no action: RepeatedFormatError
    assert {a["terminal_status"] for a in arms[1:]} == {"RepeatedFormatError"}
    blocks = [json.loads(line) for line in (run_dir / "blocks.jsonl").read_text().splitlines()]
    assert [(b["block"], b["block_pass"]) for b in blocks] == [(1, 2), (2, None)]


def _interrupted_before_exec() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C, while the child is in the group
    sum(range(10_000))  # Python code after it, where a pending handler runs


def test_ctrl_c_in_a_child_before_its_exec_is_not_the_runs_to_handle() -> None:
    """The agent's box forks its commands with Python code to run before the exec (their
    limits). Ctrl-C reaching such a child must not run the bench's handler there: it would
    raise KeyboardInterrupt in the child's fork hooks, which Python prints as a traceback (CI,
    2026-12-07), or here fail the spawn. The run itself still stops on its own Ctrl-C."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    stop = RunStop()
    try:
        with stop.signals():
            child = subprocess.run(["true"], preexec_fn=_interrupted_before_exec,
                                   capture_output=True, text=True, check=False, timeout=30)
            assert child.returncode == 0 and child.stderr == "", child.stderr
            assert not stop.stopped  # the child's signal was not the run's
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        assert stop.reason is not None and stop.reason.message == "interrupted (SIGINT)"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
