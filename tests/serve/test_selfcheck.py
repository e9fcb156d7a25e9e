"""The serve-time self-check. Faults where the truth is known exactly run against the fake
server (its /metrics counters never move); the passing case runs against the real vLLM CPU
server; the refused real case (prefix caching off) is opt-in because it starts a second vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.common.net import free_port
from compaction_bench.common.processtree import stop_tree
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.command import ServerConfig, build_command, build_env
from compaction_bench.serve.launcher import Server
from compaction_bench.serve.model import resolve_model
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.selfcheck import SelfCheckError, run_selfcheck, selfcheck_plan


def _first_line_names_the_cache(message: str) -> None:
    line = message.splitlines()[0]
    assert "prefix cache reported 0 cached tokens on a repeated prompt" in line, line
    assert "see the retention setting" in line, line


@pytest.mark.e2e
def test_a_server_that_caches_nothing_is_refused_with_the_cache_message() -> None:
    with FakeProcess(FakeConfig(cached_tokens=0, ttft_ms=1, itl_ms=1)) as fake:
        with pytest.raises(SelfCheckError) as err:
            run_selfcheck(fake.api_url, load_profile("cpu-tiny"))
        bodies = fake.requests()
    _first_line_names_the_cache(str(err.value))
    assert err.value.exit_code == ExitCode.UNAVAILABLE
    report = err.value.report
    status = {c.name: c.status for c in report.checks}
    assert status["served names"] == "pass"
    assert status["prefix cache"] == "fail"
    assert status["branch"] == "fail"
    assert status["/metrics"] == "not run"  # nothing to count
    assert not report.passed and report.server_version == "fake-1"
    # the probes: both names, then cold + repeat + branch on the target, one nonce shared
    models = [b["model"] for b in bodies]
    assert models[:2] == ["target", "compressor"] and models[2:] == ["target"] * 3
    cold, repeat, branch = (b["messages"] for b in bodies[2:])
    assert cold == repeat and cold[0] == branch[0] and cold[1] != branch[1]
    assert "Self-check " in cold[0]["content"]


@pytest.mark.e2e
def test_cached_tokens_the_counters_do_not_show_fail_the_metrics_check() -> None:
    # the fake reports 256 cached tokens per request, but its prefix_cache_hits never moves
    with (FakeProcess(FakeConfig(cached_tokens=256, ttft_ms=1, itl_ms=1)) as fake,
          pytest.raises(SelfCheckError) as err):
        run_selfcheck(fake.api_url, load_profile("cpu-tiny"))
    message = str(err.value)
    assert "prefix_cache_hits moved by 0" in message and "256 cached" in message
    status = {c.name: c.status for c in err.value.report.checks}
    assert status == {"served names": "pass", "prefix cache": "pass", "/metrics": "fail",
                      "branch": "pass", "reasoning": "not run", "tool call": "not run",
                      "server": "pass"}


@pytest.mark.e2e
def test_reasoning_and_tool_profiles_check_the_fields_the_history_format_reads() -> None:
    profile = load_profile("h200-gpt-oss-120b")
    with FakeProcess(FakeConfig(cached_tokens=0, ttft_ms=1, itl_ms=1)) as fake:
        # names, cold, repeat, branch, then the thinking and the tool request
        fake.script([{}] * 5 + [{"content": "323"}, {"content": "Paris is sunny."}])
        with pytest.raises(SelfCheckError) as err:
            run_selfcheck(fake.api_url, profile)
        fake.reset()
        fake.script([{}] * 5 + [
            {"reasoning": "17 * 19 = 323.", "content": "323"},
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}])
        with pytest.raises(SelfCheckError) as again:
            run_selfcheck(fake.api_url, profile)
        tool_body = fake.requests()[-1]
    first = {c.name: c for c in err.value.report.checks}
    assert first["reasoning"].status == "fail" and "no reasoning field" in first["reasoning"].detail
    assert first["tool call"].status == "fail" and "no tool call" in first["tool call"].detail
    second = {c.name: c for c in again.value.report.checks}
    assert second["reasoning"].status == "pass", second["reasoning"]
    assert second["tool call"].status == "pass", second["tool call"]
    assert tool_body["tool_choice"] == "auto"  # the parser is what is checked, not a grammar
    assert tool_body["tools"][0]["function"]["name"] == "get_weather"


def test_plan_follows_the_profile_block_size_and_retention() -> None:
    b300 = "\n".join(selfcheck_plan(load_profile("b300-deepseek-v4-flash-nvfp4")))
    assert "256-token blocks" in b300 and "retention unit 4096" in b300
    assert "reasoning field" in b300 and "parsed tool call" in b300
    tiny = "\n".join(selfcheck_plan(load_profile("cpu-tiny")))
    assert "128-token blocks" in tiny and "reasoning: not run" in tiny


@pytest.mark.e2e
def test_cli_check_ends_in_one_line_with_the_cache_message() -> None:
    with FakeProcess(FakeConfig(cached_tokens=0, ttft_ms=1, itl_ms=1)) as fake:
        result = subprocess.run(
            [sys.executable, "-m", "compaction_bench", "serve", "check", "--profile", "cpu-tiny",
             "--base-url",
             fake.api_url], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    _first_line_names_the_cache(lines[0].removeprefix("error: "))
    assert "FAIL prefix cache" in result.stdout  # the whole report is printed first


@pytest.mark.integration
def test_selfcheck_passes_on_the_real_cpu_server(cpu_server: Server) -> None:
    report = run_selfcheck(cpu_server.api_url, load_profile("cpu-tiny"))
    checks = {c.name: c for c in report.checks}
    assert report.passed
    assert report.server_version and report.server_version.startswith("0.32")
    assert report.cache_config["enable_prefix_caching"] == "True"
    assert report.cache_config["block_size"] == "128"
    repeat = checks["prefix cache"].data
    assert repeat["cold_cached_tokens"] == 0  # the nonce makes the first request cold
    assert repeat["cached_tokens"] == repeat["expected_cached_tokens"] > 4 * 128
    assert checks["/metrics"].data["hits_delta"] >= repeat["cached_tokens"]
    branch = checks["branch"].data
    assert branch["cached_tokens"] == branch["cap_tokens"] > 0  # full attention: block-aligned
    assert {m["id"] for m in report.models} == {"target", "compressor"}
    assert report.to_json()["passed"] is True


@pytest.mark.integration
@pytest.mark.skipif(os.environ.get("COMPBENCH_TEST_CACHE_OFF") != "1",
                    reason="starts a second vLLM server (~2 minutes on 2 cores); opt in with "
                    "COMPBENCH_TEST_CACHE_OFF=1")
def test_real_server_with_prefix_caching_off_is_refused(tmp_path: Path) -> None:
    profile = load_profile("cpu-tiny")
    config = ServerConfig(profile=profile, port=free_port())
    # the launcher never turns caching off, so the flag is appended here (argparse: last wins)
    command = [*build_command(config, resolve_model(profile.model.source)),
               "--no-enable-prefix-caching"]
    log = (tmp_path / "cache-off.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env=build_env(config), start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{config.server_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert process.poll() is None, (tmp_path / "cache-off.log").read_text()[-2000:]
        with pytest.raises(SelfCheckError) as err:
            run_selfcheck(config.api_url, profile)
        _first_line_names_the_cache(str(err.value))
        server = {c.name: c for c in err.value.report.checks}["server"]
        assert "prefix caching is off" in server.detail
    finally:
        stop_tree(process, grace_s=30)
        log.close()
