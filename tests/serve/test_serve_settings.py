"""`serve` takes its settings as every command does (issue 31): `name=value` words, a TOML file,
make's command-line variables and COMPBENCH_<NAME>; the flags users know are aliases of the same
fields. Checked through the command with `--dry-run`, which prints the exact command and starts
nothing; the one-line refusals through the real CLI, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.paths import repo_root
from compaction_bench.common.settings import settings_of
from compaction_bench.serve.cli import app
from compaction_bench.serve.settings import ServeConfig


class Done:
    """What a `serve` invocation printed (in-process: the unit tier starts no process)."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def serve(*args: str, env: dict[str, str] | None = None) -> Done:
    # a clean environment for what --from-env reads: the test's own make or CI variables
    # (MAKEFLAGS under `make test`) must not reach it
    cleared = {k: None for k in os.environ
               if k in ("MAKEFLAGS", "PORT", "PROFILE", "DRY_RUN") or k.startswith("COMPBENCH_")}
    result = CliRunner().invoke(app, ["serve", *args], env={**cleared, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Done(result.exit_code, result.stdout, result.stderr)


def command_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if " --port " in x and "vllm" in x]
    return line


def test_words_flags_and_make_variables_give_the_same_server() -> None:
    by_words = command_line(serve("profile=cpu-tiny", "port=18123", "dry_run=1"))
    by_flags = command_line(serve("--profile", "cpu-tiny", "--port", "18123", "--dry-run"))
    by_make = command_line(serve("--from-env", env={
        "MAKEFLAGS": " -- PROFILE=cpu-tiny PORT=18123 DRY_RUN=1", "PROFILE": "cpu-tiny",
        "PORT": "18123", "DRY_RUN": "1"}))
    by_prefix = command_line(serve("--from-env", env={
        "COMPBENCH_PROFILE": "cpu-tiny", "COMPBENCH_PORT": "18123", "COMPBENCH_DRY_RUN": "1"}))
    assert "--port 18123" in by_words
    assert by_words == by_flags == by_make == by_prefix


def test_a_flag_overrides_a_word_and_a_word_overrides_the_file(tmp_path: Path) -> None:
    file = tmp_path / "serve.toml"
    file.write_text('profile = "cpu-tiny"\nport = 18200\ndry_run = true\n')
    assert "--port 18200" in command_line(serve("--config", str(file)))
    assert "--port 18201" in command_line(serve("--config", str(file), "port=18201"))
    assert "--port 18202" in command_line(serve("--config", str(file), "port=18201",
                                                "--port", "18202"))


def test_a_platforms_port_is_said_and_not_taken() -> None:
    done = serve("--from-env", "profile=cpu-tiny", "dry_run=1", env={"PORT": "5000"})
    assert "--port 5000" not in command_line(done)
    assert "environment PORT='5000' ignored" in done.stderr and "COMPBENCH_PORT" in done.stderr


@pytest.mark.e2e
def test_bad_settings_are_refused_in_one_line_by_the_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    for args, needles in (
            (("router_policy=fastest",), ("unknown router policy 'fastest'", "round_robin")),
            (("replicas=0",), ("replicas", "greater than or equal to 1")),
            (("prot=8100",), ("'prot=8100'", "port")),
            (("--config", str(tmp_path / "none.toml")), ("none.toml", "no such settings file"))):
        done = subprocess.run([sys.executable, "-m", "compaction_bench", "serve", *args],
                              capture_output=True, text=True, timeout=120, check=False, env=env)
        assert done.returncode == ExitCode.USAGE, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert all(n in lines[0] for n in needles), (args, lines[0])


def test_settings_lists_every_field_with_its_make_variable() -> None:
    done = serve("--settings")
    assert done.returncode == 0, done.stderr
    for setting in settings_of(ServeConfig):
        assert any(line.split()[:2] == [setting.key, setting.variable]
                   for line in done.stdout.splitlines()), setting.key


@pytest.mark.e2e
def test_make_serve_passes_its_variables_through() -> None:
    """The front door itself: `make serve PROFILE=... PORT=... DRY_RUN=1` reaches the command's
    settings (`-o install`: the installed environment is taken as it is)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS") and not k.startswith("COMPBENCH_")}
    done = subprocess.run(["make", "-o", "install", "--no-print-directory", "serve",
                           "PROFILE=cpu-tiny", "PORT=18501", "DRY_RUN=1"], cwd=repo_root(),
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--port 18501" in command_line(Done(0, done.stdout, done.stderr))


def run(*args: str, env: dict[str, str] | None = None) -> Done:
    """Any serving command in-process, with what --from-env reads cleared (as `serve`); a
    known failure (what `run_cli` prints as one line) comes back as its text on stderr."""
    cleared = {k: None for k in os.environ
               if k in ("MAKEFLAGS", "PORT", "PROFILE") or k.startswith("COMPBENCH_")}
    result = CliRunner().invoke(app, list(args), env={**cleared, **(env or {})})
    if isinstance(result.exception, SuiteError):
        return Done(1, result.stdout, str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Done(result.exit_code, result.stdout, result.stderr)


def test_check_stop_and_prepare_model_take_the_same_grammar() -> None:
    # port 1: nothing answers there and no server of this checkout is recorded on it, so
    # neither command touches a real server (stop without a port would stop them all)
    make = {"MAKEFLAGS": " -- PORT=1", "PORT": "1"}
    for command in ("check", "stop"):
        outs = set()
        for args, env in (((command, "port=1"), None), ((command, "--port", "1"), None),
                          ((command, "--from-env"), make)):
            done = run(*args, env=env)
            outs.add(done.stdout + done.stderr)
        assert len(outs) == 1, (command, outs)
        (out,) = outs
        assert ("127.0.0.1:1" in out) if command == "check" else (
            "no server recorded in .run/ for port 1" in out), out
    for command, names in (("check", {"profile", "port", "base_url", "speculative"}),
                           ("stop", {"port"}), ("prepare-model", {"profile"})):
        listed = run(command, "--settings").stdout
        assert {line.split()[0] for line in listed.splitlines()} >= names, (command, listed)
    refused = run("stop", "port=0")
    assert refused.returncode == 1 and refused.stderr.startswith("invalid stop settings: port")
    assert "(got '0')" in refused.stderr and "\n" not in refused.stderr
