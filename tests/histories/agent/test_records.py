"""What the records say of the box, and the syscalls the box closes: the seccomp filter and
`--disable-userns` tried from inside (ptrace of the box's own pid 1, nested namespaces, mounts,
keyrings), the level and limits in every manifest (bench and acquisition) and in the resume
fingerprint, so a run resumed under another box is refused naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.episode import open_episode
from compaction_bench.histories.agent.sandbox import Confinement, SandboxLimits
from compaction_bench.histories.agent.seccomp import DENIED, filter_program
from compaction_bench.histories.agent.workspace import ConfinedEnvironment, Workspace
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

LS = "THOUGHT: Look around.\n\n```bash\nls\n```"
PTRACE_PID1 = ("python3 -c \"import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "print('ptrace', libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))\n"
               "print('keyctl', libc.syscall(250, 0, 0, 0, 0), "
               "os.strerror(ctypes.get_errno()))\"")


def test_the_filter_is_whole_instructions_ending_in_returns() -> None:
    program = filter_program()
    if program is None:
        pytest.skip("the filter is written for x86_64")
    assert len(program) % 8 == 0 and len(program) // 8 < 256
    assert len(program) // 8 > len(DENIED)


@pytest.mark.e2e
def test_ptrace_nested_namespaces_and_mounts_are_refused_inside() -> None:
    with Workspace(load_task("fix-median")) as ws:
        assert isinstance(ws.env, ConfinedEnvironment)
        started = time.monotonic()
        got = str(ws.env.execute({"command": PTRACE_PID1 + "; echo after"}, timeout=10)
                  ["output"])
        assert "ptrace -1 Operation not permitted" in got and "after" in got, got
        assert "keyctl -1 Operation not permitted" in got
        assert time.monotonic() - started < 8  # pid 1 was not stopped: the command ended
        nested = str(ws.env.execute({"command": "unshare -U true; echo u=$?; unshare -n true; "
                                                "echo n=$?; mount -t tmpfs x /tmp; echo m=$?"},
                                    timeout=10)["output"])
        assert "u=1" in nested and "n=1" in nested and "m=" in nested and "m=0" not in nested


GAPS = ("python3 -c \"import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr in (('modify_ldt', 154), ('fanotify_init', 300), ('memfd_secret', 447), "
        "('landlock_create_ruleset', 444), ('listmount', 458)):\n"
        "    print(name, libc.syscall(nr, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))\n"
        "try:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n    print('vsock open')\n"
        "except OSError as e:\n    print('vsock', e.errno)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\nprint('unix ok')\"")


@pytest.mark.e2e
def test_the_gaps_of_issue_34_are_closed_and_ordinary_sockets_still_open() -> None:
    with Workspace(load_task("fix-median")) as ws:
        assert isinstance(ws.env, ConfinedEnvironment)
        got = str(ws.env.execute({"command": GAPS}, timeout=20)["output"])
        for name in ("modify_ldt", "fanotify_init", "memfd_secret", "landlock_create_ruleset",
                     "listmount"):
            assert f"{name} -1 Operation not permitted" in got, got
        assert "vsock 1" in got and "vsock open" not in got, got  # EPERM
        assert "unix ok" in got


@pytest.mark.e2e
def test_acquisition_provenance_records_the_box() -> None:
    config = ChatModelConfig(model_name="m", api_url="http://127.0.0.1:9/v1")
    with open_episode(load_task("fix-median"), config) as episode:
        box = episode.provenance["sandbox"]
    assert box["level"] == "bwrap" and box["limits"]["workspace_bytes"] > 0
    assert "seccomp" in box and set(box["totals"]) == {"in_force", "not_in_force"}
    with open_episode(load_task("fix-median"), config) as episode:
        assert json.dumps(episode.provenance)  # what the history file stores


def _bench(results: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={url}", f"external_url={url}", "step_limit=2", "selfcheck=0", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(results)})


@pytest.mark.e2e
def test_the_manifest_and_the_fingerprint_hold_the_box(tmp_path: Path) -> None:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=1, default_content=LS)) as fake:
        done = _bench(tmp_path, fake.api_url, "blocks=1", "arms=clean", "run_id=boxed")
        assert done.returncode == 0, done.stderr
        path = tmp_path / "boxed" / "manifest.json"
        manifest = json.loads(path.read_text())
        box = manifest["sandbox"]
        assert box == manifest["fingerprint"]["sandbox"]
        assert box["level"] == "bwrap" and box["opt_in"] is None
        assert box["limits"]["total_memory_bytes"] > 0 and "memory" in box["totals"]["in_force"]
        # as if the run had been made under a box of another level: RESUME is another run
        manifest["fingerprint"]["sandbox"] = {**box, "level": "unshare",
                                              "opt_in": "UNSAFE_SANDBOX_UNSHARE=1"}
        path.write_text(json.dumps(manifest))
        again = _bench(tmp_path, fake.api_url, "resume=boxed")
    assert again.returncode != 0
    line = [x for x in again.stderr.splitlines() if x.strip()][-1]
    assert "this is not the same run: sandbox (run: {'level': 'unshare'" in line, line


def test_an_unconfined_run_says_who_allowed_it_and_what_it_left_open() -> None:
    record = Confinement("none", None, None, "UNSAFE_NO_SANDBOX=1").record(SandboxLimits())
    assert record["opt_in"] == "UNSAFE_NO_SANDBOX=1"
    assert str(record["confines"]).startswith("nothing")
    assert record["seccomp"] == {"seccomp": None, "why": "none loads no filter"}
