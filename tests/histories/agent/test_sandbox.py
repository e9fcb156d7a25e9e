"""What the agent's commands can and cannot do, tried as an attacker would: real commands in the
real sandbox (bubblewrap here), from a tool command, from validation and from a git hook."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.histories.agent.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    confinement,
)
from compaction_bench.histories.agent.workspace import (
    ConfinedEnvironment,
    Workspace,
)
from compaction_bench.histories.tasks.task import load_task

pytestmark = pytest.mark.e2e


@pytest.fixture
def workspace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.setenv("COMPRESSOR_API_KEY", "sk-caller-secret-0123456789")
    monkeypatch.setenv("HF_TOKEN", "hf_callersecret0123456789abcd")
    with Workspace(load_task("fix-median")) as ws:
        yield ws


def run(ws: Workspace, command: str, timeout: int = 10) -> dict[str, object]:
    assert isinstance(ws.env, ConfinedEnvironment)
    return ws.env.execute({"command": command}, timeout=timeout)


def test_this_machine_confines_with_bubblewrap() -> None:
    assert confinement().level == "bwrap", confinement()  # the manifest records the level


def test_writes_outside_the_workspace_fail_and_inside_succeed(workspace: Workspace,
                                                              tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    got = run(workspace, f"echo x > {outside}; echo x > /etc/escaped; echo ok > inside.txt")
    assert not outside.exists() and not Path("/etc/escaped").exists()
    assert "Read-only file system" in str(got["output"]) or "No such file" in str(got["output"])
    assert (workspace.path / "inside.txt").read_text() == "ok\n"


def test_the_checkout_home_and_sibling_workspaces_are_hidden(workspace: Workspace) -> None:
    with Workspace(load_task("fix-slugify")) as sibling:
        checkout = run(workspace, f"ls -A {repo_root()}; ls -A /root")["output"]
        assert "pyproject.toml" not in str(checkout) and ".venv" not in str(checkout)
        listing = str(run(workspace, f"ls -A {sibling.path.parent}")["output"]).split()
        assert workspace.path.name in listing and sibling.path.name not in listing
        peek = run(workspace, f"cat {sibling.path / 'textkit.py'}")
        assert "No such file" in str(peek["output"]) and peek["returncode"] != 0


def test_no_secrets_in_commands_validation_or_hooks(workspace: Workspace) -> None:
    got = run(workspace, "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'")
    assert "caller-secret" not in str(got["output"]) and "hf_caller" not in str(got["output"])
    # code the agent appends to the module runs during validation: still no secrets
    module = workspace.path / "stats_utils.py"
    module.write_text(module.read_text() + "\nimport os\nprint(dict(os.environ))\n")
    assert "caller-secret" not in workspace.validate().output
    # a git hook and an fsmonitor the agent planted run, confined, during patch capture
    hook = workspace.path / ".git" / "hooks" / "fsmon"
    hook.write_text(f"#!/bin/sh\nenv > {workspace.path}/hook-ran; echo x > /tmp/escaped\n")
    hook.chmod(0o755)
    run(workspace, "git config core.fsmonitor .git/hooks/fsmon")
    workspace.patch()
    assert not Path("/tmp/escaped").exists()
    ran = workspace.path / "hook-ran"
    assert not ran.exists() or "caller-secret" not in ran.read_text()


def test_no_network_not_even_the_hosts_loopback(workspace: Workspace) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the shutdown below ends a wait that got nothing
            accepted.append(server.accept()[0])

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    got = run(workspace, f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                         f"{port}), timeout=3)\" && echo CONNECTED")
    time.sleep(0.2)
    server.shutdown(socket.SHUT_RDWR)
    waiter.join(5)
    server.close()
    assert "CONNECTED" not in str(got["output"]) and not accepted


def test_nothing_outlives_the_command(workspace: Workspace) -> None:
    start = time.monotonic()
    got = run(workspace, "setsid sleep 40 & nohup sleep 41 >/dev/null 2>&1 & "
                         "(sleep 42 &) ; echo started", timeout=5)
    assert "started" in str(got["output"]) and time.monotonic() - start < 5
    time.sleep(0.5)
    sleepers = [p for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [])[:2] in (["sleep", "40"], ["sleep", "41"],
                                                      ["sleep", "42"])]
    assert not sleepers, sleepers
    start = time.monotonic()
    stuck = run(workspace, "setsid sleep infinity & sleep infinity", timeout=2)
    assert stuck["returncode"] == -1 and time.monotonic() - start < 6


def test_a_fork_bomb_and_an_output_flood_are_contained(workspace: Workspace) -> None:
    start = time.monotonic()
    bomb = run(workspace, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", timeout=5)
    assert time.monotonic() - start < 10
    assert "fork" in str(bomb["output"]).lower() or bomb["returncode"] != 0
    flood = run(workspace, "yes 0123456789012345678901234567890123456789", timeout=10)
    assert flood["returncode"] == -1 and "OutputFlood" in str(flood.get("extra"))
    assert len(str(flood["output"])) < 5000


def test_deleting_git_does_not_change_the_patch(workspace: Workspace) -> None:
    run(workspace, "echo '# changed' >> stats_utils.py")
    before = workspace.patch()
    run(workspace, "rm -rf .git")
    assert workspace.patch() == before and "+# changed" in before


def test_limits_hold_for_a_plain_sandbox() -> None:
    folder = Path(tempfile.mkdtemp(prefix="compbench-limits-"))
    box = Sandbox(folder, SandboxLimits(file_bytes=1024, memory_bytes=512 * 2**20))
    big = box.run("head -c 4096 /dev/zero > f", timeout_s=10)
    assert (folder / "f").stat().st_size <= 1024 and "File size limit exceeded" in big.output
    hog = box.run("python3 -c \"x = bytearray(1024 * 2**20)\"", timeout_s=10)
    assert hog.returncode != 0 and "MemoryError" in hog.output
    assert os.geteuid() != 0 or box.uid is not None  # root: commands run as their own uid
    shutil.rmtree(folder)


def test_a_workspace_others_cannot_enter_is_refused_with_the_fix(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root switches to a uid of its own (this machine runs tests as root)")
    with pytest.raises(SandboxUnavailable, match="not reachable by the sandbox's own uid"):
        Sandbox(tmp_path)  # pytest's temp folder is mode 700
