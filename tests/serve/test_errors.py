"""Bad input ends with one clear message: checked through the real CLI, as a user meets it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.common.errors import ExitCode
from compaction_bench.serve.errors import EngineUnavailableError, ModelNotFoundError, PortInUseError
from compaction_bench.serve.hardware import detect_gpus
from compaction_bench.serve.launcher import check_engine, check_port
from compaction_bench.serve.model import resolve_model
from compaction_bench.serve.profile import load_profile


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compaction_bench", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str,
                          code: int = ExitCode.USAGE) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.e2e
def test_cli_unknown_profile() -> None:
    assert_one_clear_line(cli("serve", "--profile", "nope"), "unknown profile 'nope'", "cpu-tiny")


@pytest.mark.e2e
def test_cli_malformed_profile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n')
    assert_one_clear_line(cli("serve", "--profile", str(bad)), str(bad), "field description")


@pytest.mark.e2e
def test_port_in_use_names_port_and_holder() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortInUseError) as err:
            check_port("127.0.0.1", port)
        assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in str(err.value)
        result = cli("serve", "--profile", "cpu-tiny", "--port", str(port))
        assert_one_clear_line(result, f"port {port}", f"PORT={port + 1}")


@pytest.mark.e2e
@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU")
def test_gpu_profile_on_a_cpu_machine_says_so() -> None:
    with pytest.raises(EngineUnavailableError, match=r"has no NVIDIA GPU.*PROFILE=cpu-tiny"):
        check_engine(load_profile("b300-deepseek-v4-flash-nvfp4"))
    assert_one_clear_line(cli("serve", "--profile", "h200-gpt-oss-120b"), "needs 1 NVIDIA GPU",
                          code=ExitCode.UNAVAILABLE)


def test_uncached_hub_model_is_not_downloaded(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError, match=r"never downloads at run time.*hf download"):
        resolve_model("deepseek-ai/DeepSeek-V4-Flash")


def test_model_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json"):
        resolve_model(str(tmp_path))
