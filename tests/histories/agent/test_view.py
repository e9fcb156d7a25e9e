"""The box's allowlist view, tried as an attacker would: real unix-socket servers under /run,
/var/tmp and the home folder, real files planted world-readable outside the workspace, reached
for from a tool command, from validation and from a git hook; and who may run the box at all
(supplementary groups, the explicit opt-in for `unshare`), checked in real child processes of
another uid."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.histories.agent.sandbox import Confinement, Sandbox, _probe, bwrap_command
from compaction_bench.histories.agent.workspace import ConfinedEnvironment, Workspace
from compaction_bench.histories.tasks.task import load_task

pytestmark = pytest.mark.e2e
TAG = f"{os.getpid()}-{int(time.time() * 1000) % 10**6}"
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
    / "site-packages"
CONNECT = ("python3 -c \"import socket, sys\nfor p in sys.argv[1:]:\n"
           "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(p)\n"
           "        print('CONNECTED', p)\n    except OSError as e:\n"
           "        print('refused', p, e)\n"
           "\" ")


class UnixServers:
    """Listening AF_UNIX sockets (mode 0777: only the view can keep a client out) that count
    the connections they accept."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.accepted: list[str] = []
        self.sockets: list[socket.socket] = []
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            path.chmod(0o777)
            server.listen()
            server.settimeout(0.2)
            self.sockets.append(server)
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.running:
            for server in self.sockets:
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    self.accepted.append(server.getsockname())
                    conn.close()

    def close(self) -> None:
        self.running = False
        self.thread.join(5)
        for server, path in zip(self.sockets, self.paths, strict=True):
            server.close()
            path.unlink(missing_ok=True)


@pytest.fixture
def servers() -> Iterator[UnixServers]:
    paths = [Path(f"/run/compbench-{TAG}.sock"), Path(f"/var/tmp/compbench-{TAG}.sock"),
             Path.home() / f".compbench-{TAG}.sock", Path(f"/run/user/0/compbench-{TAG}.sock")]
    found = UnixServers(paths)
    yield found
    found.close()


@pytest.fixture
def planted() -> Iterator[dict[Path, str]]:
    """World-readable secrets outside the workspace and the task's tree."""
    places = [Path(f"/etc/compbench-{TAG}.conf"), Path(f"/opt/compbench-{TAG}/token"),
              Path(f"/srv/compbench-{TAG}"), Path(f"/var/tmp/compbench-{TAG}.txt"),
              Path(f"/var/lib/compbench-{TAG}"), Path.home() / f".netrc-compbench-{TAG}",
              repo_root().parent / f"compbench-beside-{TAG}",
              Path(f"/tmp/compbench-cache-{TAG}/hub/token")]
    secrets = {}
    for index, path in enumerate(places):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"PLANTED-SECRET-{index}-{TAG}\n")
        path.chmod(0o644)
        secrets[path] = f"PLANTED-SECRET-{index}-{TAG}"
    yield secrets
    for path in places:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if path.parent.name.startswith("compbench-"):
                shutil.rmtree(path.parent)


def run(ws: Workspace, command: str, timeout: int = 15) -> str:
    assert isinstance(ws.env, ConfinedEnvironment)
    return str(ws.env.execute({"command": command}, timeout=timeout)["output"])


def test_only_the_allowlist_exists_inside() -> None:
    with Workspace(load_task("fix-median")) as ws:
        top = set(run(ws, "ls -A /").split())
        assert top <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev",
                       "proc", "tmp"}, top
        assert set(run(ws, "ls -A /etc").split()) <= {"alternatives", "ld.so.cache", "passwd",
                                                      "group"}
        assert "ok" in run(ws, "python3 -c 'import unittest, json; print(\"ok\")'")
        assert "git version" in run(ws, "git --version")
        assert "agent" in run(ws, "id")
        assert "Read-only" in run(ws, "echo x > /x; echo x > /dev/x; echo x > /usr/x")


def test_no_host_unix_socket_is_reachable_from_commands_validation_or_hooks(
        servers: UnixServers) -> None:
    targets = " ".join(str(p) for p in servers.paths)
    with contextlib.ExitStack() as stack:
        ws = stack.enter_context(Workspace(load_task("fix-median")))
        tool = run(ws, CONNECT + targets)
        assert tool.count("refused") == len(servers.paths), tool
        # validation: the module under test tries them when the tests import it
        module = ws.path / "stats_utils.py"
        module.write_text(module.read_text() + "\nimport socket\nfor p in "
                          f"{[str(p) for p in servers.paths]!r}:\n    try:\n"
                          "        socket.socket(socket.AF_UNIX).connect(p); print('CONNECTED')\n"
                          "    except OSError: pass\n")
        assert "CONNECTED" not in ws.validate().output
        # a git hook the agent planted, run by git inside the box and by patch capture
        hook = ws.path / ".git" / "hooks" / "pre-commit"
        hook.write_text("#!/bin/sh\n" + CONNECT + targets + f" > {ws.path}/hook-out\n")
        hook.chmod(0o755)
        run(ws, "git config core.fsmonitor .git/hooks/pre-commit; git add -A; "
                "git -c user.name=a -c user.email=a@b commit -qm x; git status --short")
        ws.patch()
        assert "refused" in (ws.path / "hook-out").read_text()
    time.sleep(0.3)
    assert not servers.accepted, servers.accepted


def test_planted_world_readable_files_are_not_readable(planted: dict[Path, str]) -> None:
    with Workspace(load_task("fix-median")) as ws:
        got = run(ws, "cat " + " ".join(str(p) for p in planted) + " 2>&1; ls -A / /etc")
        for secret in planted.values():
            assert secret not in got, got
        module = ws.path / "stats_utils.py"
        module.write_text(module.read_text() + "\nfor p in "
                          f"{[str(p) for p in planted]!r}:\n    try:\n"
                          "        print(open(p).read())\n    except OSError: pass\n")
        out = ws.validate().output
        assert not any(secret in out for secret in planted.values()), out


def test_a_workspace_under_the_home_folder_shows_nothing_else_of_it() -> None:
    home = Path(f"/home/compbench-{TAG}")
    (home / "tmp").mkdir(parents=True)
    home.chmod(0o755)
    (home / ".netrc").write_text("machine huggingface.co password hf_PLANTED\n")
    (home / ".netrc").chmod(0o644)
    try:
        with Workspace(load_task("fix-median"), base_dir=home / "tmp") as ws:
            got = run(ws, f"cat {home}/.netrc ~/.netrc 2>&1; ls -A {home}")
            assert "hf_PLANTED" not in got and ".netrc" not in got.split()
    finally:
        shutil.rmtree(home)


def _as_user(code: str, *, groups: str | None, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """`code` run by the system python as uid 61900, with the suite importable."""
    ids = ["--reuid=61900", "--regid=61900"]
    ids += [f"--groups={groups}"] if groups else ["--clear-groups"]
    prelude = f"import site; site.addsitedir({str(SITE)!r})\n"
    return subprocess.run(["setpriv", *ids, "/usr/bin/python3", "-c", prelude + code],
                          capture_output=True, text=True, timeout=120, cwd="/tmp",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", **(env or {})},
                          check=False)


CONFINE = ("from compaction_bench.histories.agent.sandbox import confinement\n"
           "print('LEVEL', confinement().level)")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_a_non_root_suite_with_supplementary_groups_is_refused_naming_the_fix() -> None:
    refused = _as_user(CONFINE, groups="61901,61902")
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert "supplementary groups 61901,61902" in line and "--clear-groups" in line
    # the weaker level does not lift the refusal; only the explicit opt-out does
    weaker = _as_user(CONFINE, groups="61901", env={"UNSAFE_SANDBOX_UNSHARE": "1"})
    assert weaker.returncode != 0 and "supplementary groups" in weaker.stderr
    unsafe = _as_user(CONFINE, groups="61901", env={"UNSAFE_NO_SANDBOX": "1"})
    assert "LEVEL none" in unsafe.stdout, unsafe.stderr
    plain = _as_user(CONFINE, groups=None)
    assert "LEVEL bwrap" in plain.stdout, plain.stderr


def _where_bwrap_cannot_run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`code` run in a box of its own that allows no further user namespace (as on a host
    where unprivileged user namespaces are off): the system's view, read-only, as uid 61900."""
    # the checkout is bound back after /tmp is emptied (a clone under /tmp would vanish)
    argv, extra = bwrap_command([
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--ro-bind", str(repo_root()), str(repo_root()),
        "--unshare-user", "--unshare-pid", "--disable-userns", "--uid", "61900", "--gid",
        "61900", "--die-with-parent", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/tmp", *[a for k, v in env.items() for a in ("--setenv", k, v)],
        "--chdir", "/tmp", "/usr/bin/python3", "-c",
        f"import site; site.addsitedir({str(SITE)!r})\n" + code])
    return subprocess.run(["setpriv", "--reuid=61900", "--regid=61900", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **extra}, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_where_bwrap_cannot_run_unshare_is_never_chosen_silently() -> None:
    refused = _where_bwrap_cannot_run(CONFINE, {})
    assert refused.returncode != 0, refused.stdout
    line = refused.stderr.strip().splitlines()[-1]
    assert "UNSAFE_SANDBOX_UNSHARE=1" in line and "UNSAFE_NO_SANDBOX=1" in line
    # opted in, unshare is probed as the uid that runs it: it cannot start here either
    opted = _where_bwrap_cannot_run(CONFINE, {"UNSAFE_SANDBOX_UNSHARE": "1"})
    assert opted.returncode != 0 and "cannot be confined" in opted.stderr
    unsafe = _where_bwrap_cannot_run(CONFINE, {"UNSAFE_NO_SANDBOX": "1"})
    assert "LEVEL none" in unsafe.stdout, unsafe.stderr


def test_opted_in_unshare_is_probed_as_the_commands_uid_and_recorded_weaker() -> None:
    tool = shutil.which("unshare")
    if tool is None:
        pytest.skip("no util-linux unshare here")
    probed = _probe(Confinement("unshare", tool, None, "UNSAFE_SANDBOX_UNSHARE=1"))
    assert probed is not None  # it runs as the uid the commands get (root suites: their own)
    folder = Path(tempfile.mkdtemp(prefix="compbench-unshare-"))  # others may enter /tmp
    folder.chmod(0o755)
    box = Sandbox(folder, level=probed)
    try:
        got = box.run("ps ax | wc -l; python3 -c \"import socket; socket.create_connection("
                      "('127.0.0.1', 9), timeout=2)\" 2>&1 | tail -1", timeout_s=20)
    finally:
        box.close()
        shutil.rmtree(folder)
    assert "Network is unreachable" in got.output and int(got.output.split()[0]) < 10
    record = probed.record(box.limits)
    assert record["opt_in"] == "UNSAFE_SANDBOX_UNSHARE=1"
    assert "unix sockets stay reachable" in str(record["confines"])


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_a_non_root_suite_gets_the_same_view(servers: UnixServers,
                                             planted: dict[Path, str]) -> None:
    code = ("from compaction_bench.histories.agent.workspace import Workspace\n"
            "from compaction_bench.histories.tasks.task import load_task\n"
            "with Workspace(load_task('fix-median')) as ws:\n"
            f"    print(ws.env.execute({{'command': {CONNECT + ' '.join(map(str, servers.paths))!r}"
            f" + '; cat {' '.join(map(str, planted))} 2>&1; id -G'}})['output'])\n"
            "    print('LEVEL', ws.sandbox.describe()['level'], ws.sandbox.uid)")
    done = _as_user(code, groups=None)
    assert done.returncode == 0, done.stderr
    assert "LEVEL bwrap None" in done.stdout and "refused" in done.stdout
    assert "CONNECTED" not in done.stdout and "61900" in done.stdout
    assert not any(secret in done.stdout for secret in planted.values()), done.stdout
    time.sleep(0.2)
    assert not servers.accepted
