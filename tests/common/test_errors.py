"""The one command-line handler: known failures end with one line and an exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.common.net import api_url, free_port, server_url


def run(*args: str, results: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`compaction-bench ARGS` as a user runs it (run folders under `results`)."""
    env = {**os.environ, **({"COMPBENCH_RESULTS": str(results)} if results else {})}
    return subprocess.run([sys.executable, "-m", "compaction_bench", *args], capture_output=True,
                          text=True, timeout=120, check=False, env=env)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result
    return lines[-1]


@pytest.mark.e2e
@pytest.mark.parametrize(("args", "code", "needle"), [
    (("bench", "blocks=0"), ExitCode.USAGE, "blocks: Input should be greater than 0"),
    (("bench", "regime=busy"), ExitCode.USAGE, "regime: Input should be"),
    (("bench", "profile=nope"), ExitCode.USAGE, "unknown profile 'nope'"),
    (("bench", "PORT=70000"), ExitCode.USAGE, "port: Input should be less than 65536"),
    (("bench", "base_url=ftp://x"), ExitCode.USAGE, "not a server URL"),
    (("bench", "blocks"), ExitCode.USAGE, "give settings as name=value"),
    (("bench", "--config", "/no/such.toml"), ExitCode.USAGE, "/no/such.toml: no such settings"),
    (("report", "/no/such/run"), ExitCode.USAGE, "no such run folder"),
    (("nonsense",), ExitCode.USAGE, "No such command"),
])
def test_cli_failures_are_one_line(args: tuple[str, ...], code: int, needle: str) -> None:
    result = run(*args)
    assert result.returncode == code, result.stderr
    line = last_line(result)
    assert line.startswith("error: ") and needle in line, line
    if code == ExitCode.USAGE:
        assert len([x for x in result.stderr.splitlines() if x.strip()]) == 1, result.stderr


@pytest.mark.e2e
def test_histories_cli_unknown_task_is_one_line() -> None:
    result = run("histories", "arms", "--task", "nope")
    assert result.returncode == ExitCode.USAGE
    assert "no clean history" in last_line(result) or "unknown task" in last_line(result)


@pytest.mark.e2e
def test_dead_server_is_unavailable_with_the_url(tmp_path: Path) -> None:
    port = free_port()
    result = run("bench", "profile=cpu-tiny", f"base_url=http://127.0.0.1:{port}",
                 "arms=clean", "blocks=1", results=tmp_path)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert f"127.0.0.1:{port}" in last_line(result)
    # the run recorded nothing: no empty run folder is left behind (one was, in the checkout's
    # own results/, by this very test until 2026-12-07)
    assert list(tmp_path.iterdir()) == []


def test_urls_normalize_either_form() -> None:
    assert api_url("http://h:1") == api_url("http://h:1/v1/") == "http://h:1/v1"
    assert server_url("http://h:1/v1") == server_url("http://h:1/") == "http://h:1"
