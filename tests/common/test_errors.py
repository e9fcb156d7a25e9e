"""The one command-line handler: known failures end with one line and an exit code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.common.net import api_url, free_port, server_url


def run(*args: str, module: str = "compaction_bench.bench.cli") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, check=False)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result
    return lines[-1]


@pytest.mark.parametrize(("args", "code", "needle"), [
    (("run", "--blocks", "0"), ExitCode.USAGE, "--blocks"),
    (("run", "--regime", "busy"), ExitCode.USAGE, "unknown regime 'busy'"),
    (("run", "--profile", "nope"), ExitCode.USAGE, "unknown profile 'nope'"),
    (("run", "--port", "70000"), ExitCode.USAGE, "--port"),
    (("run", "--base-url", "ftp://x"), ExitCode.USAGE, "not a server URL"),
    (("report", "/no/such/run"), ExitCode.USAGE, "no such run folder"),
    (("nonsense",), ExitCode.USAGE, "No such command"),
])
def test_bench_cli_failures_are_one_line(args: tuple[str, ...], code: int, needle: str) -> None:
    result = run(*args)
    assert result.returncode == code, result.stderr
    line = last_line(result)
    assert line.startswith("error: ") and needle in line, line
    if code == ExitCode.USAGE:
        assert len([x for x in result.stderr.splitlines() if x.strip()]) == 1, result.stderr


def test_histories_cli_unknown_task_is_one_line() -> None:
    result = run("arms", "--task", "nope", module="compaction_bench.histories.cli")
    assert result.returncode == ExitCode.USAGE
    assert "no clean history" in last_line(result) or "unknown task" in last_line(result)


def test_dead_server_is_unavailable_with_the_url(tmp_path: object) -> None:
    port = free_port()
    result = run("run", "--profile", "cpu-tiny", "--base-url", f"http://127.0.0.1:{port}",
                 "--arms", "clean", "--blocks", "1")
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert f"127.0.0.1:{port}" in last_line(result)


def test_urls_normalize_either_form() -> None:
    assert api_url("http://h:1") == api_url("http://h:1/v1/") == "http://h:1/v1"
    assert server_url("http://h:1/v1") == server_url("http://h:1/") == "http://h:1"
