"""A fresh per-run copy of a task's workspace, and the confined environment the agent's commands
run in (`histories.agent.sandbox`): tool commands and local validation alike, so code the agent
wrote never runs outside the box.

Each run gets its own copy (made a git repository by the suite before the agent acts, for the
agent's own use); the copy is removed when the run ends. The patch is read from the host side
against the pristine tree taken before the agent acted (`histories.agent.capture`: nothing of
the agent's repository is read and nothing of the agent's runs). Validation runs, confined, in a
tree built host-side from the pristine task with only the agent's patch applied, refused when
the patch holds more than source (a test file, a link, bytecode, a shadowing module), with the
interpreter started isolated (`histories.tasks.validation`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig

from compaction_bench.common.files import remove_tree
from compaction_bench.histories.agent.capture import CaptureError, Snapshots
from compaction_bench.histories.agent.sandbox import Sandbox, SandboxLimits
from compaction_bench.histories.agent.totals import mount_workspace, unmount_workspace
from compaction_bench.histories.tasks.task import Task
from compaction_bench.histories.tasks.validation import (
    Canary,
    expected_tests,
    isolated_command,
    refusal_line,
    refusals,
    unittest_verdict,
    validation_tree,
)

VALIDATION_TAIL_CHARS = 4000
UNITTEST = re.compile(r"(^|\s)-m\s+unittest(\s|$)")  # a validation judged on unittest's report


class ConfinedEnvironmentConfig(LocalEnvironmentConfig):
    output_cap_chars: int = 4000


class ConfinedEnvironment(LocalEnvironment):
    """mini-swe-agent's local environment, with every command run in the workspace's sandbox:
    same result shape and submission check as mini-swe-agent's."""

    config: ConfinedEnvironmentConfig

    def __init__(self, sandbox: Sandbox, **kwargs: Any) -> None:
        super().__init__(config_class=ConfinedEnvironmentConfig, **kwargs)
        self.sandbox = sandbox

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Run one command confined; report a timeout or an output flood like a failure."""
        limit = timeout or self.config.timeout
        got = self.sandbox.run(str(action.get("command", "")), timeout_s=limit,
                               cwd=Path(cwd) if cwd else None)
        output: dict[str, Any] = {"output": got.output, "returncode": got.returncode,
                                  "exception_info": ""}
        if got.timed_out:
            output["exception_info"] = (f"the command timed out after {limit} s and was "
                                        "killed with everything it started")
            output["extra"] = {"exception_type": "TimeoutExpired"}
        elif got.flooded:
            output["exception_info"] = (f"the command was killed: its output passed "
                                        f"{self.sandbox.limits.output_kill_bytes} bytes")
            output["extra"] = {"exception_type": "OutputFlood"}
        if got.truncated:
            output["output"] += (f"\n[output truncated: {len(got.output)} characters of "
                                 f"{got.total_bytes} bytes shown]")
        self._check_finished(output)
        return output


def workspace_limits(task: Task) -> SandboxLimits:
    """The limits a run of `task` gives its box (the run manifest and fingerprint record them)."""
    return SandboxLimits(output_cap_chars=task.spec.output_cap_chars,
                         cpu_s=max(60, 4 * task.spec.command_timeout_s))


@dataclass
class Validation:
    passed: bool
    returncode: int
    output: str


class Workspace:
    """`with Workspace(task) as ws:` gives a fresh copy and an environment running in it."""

    def __init__(self, task: Task, base_dir: Path | None = None,
                 limits: SandboxLimits | None = None) -> None:
        self.task = task
        self.base_dir = base_dir
        self.limits = limits or workspace_limits(task)
        self.path = Path()
        self.env: ConfinedEnvironment | None = None
        self.sandbox: Sandbox | None = None
        self.snapshots: Snapshots | None = None
        self._mounted: dict[Path, str | None] = {}  # folder: None if a sized tmpfs, else why not

    def __enter__(self) -> Workspace:
        self.path = self._folder(f"compbench-{self.task.id}-")
        try:
            shutil.copytree(self.task.workspace, self.path, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
            self._git("init", "-q")
            self._git("add", "-A")
            self._git("-c", "user.name=compbench", "-c", "user.email=compbench@localhost",
                      "commit", "-q", "-m", "task workspace")
            self.snapshots = Snapshots(self.limits.capture_bytes)
            self.snapshots.keep_base(self.path)
            self.sandbox = Sandbox(self.path, self.limits,
                                   workspace_total=self._mounted.get(self.path))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.env = ConfinedEnvironment(self.sandbox, cwd=str(self.path),
                                       timeout=self.task.spec.command_timeout_s,
                                       output_cap_chars=self.task.spec.output_cap_chars)
        return self

    def _folder(self, prefix: str) -> Path:
        """A new folder others may enter, a sized tmpfs where the host allows one."""
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self.base_dir))
        folder.chmod(0o755)
        self._mounted[folder] = mount_workspace(folder, self.limits.workspace_bytes,
                                                self.limits.workspace_files)
        return folder

    def _remove(self, folder: Path) -> None:
        if self._mounted.pop(folder, "not mounted") is None:
            unmount_workspace(folder)
        remove_tree(folder)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if self.path != Path():
            self._remove(self.path)
        if self.snapshots is not None:
            shutil.rmtree(self.snapshots.gitdir, ignore_errors=True)

    def _git(self, *args: str) -> str:
        """The suite's own git, run before the agent acts (the copy is not the agent's yet)."""
        result = subprocess.run(["git", *args], cwd=self.path, capture_output=True, text=True,
                                timeout=60, check=True, env={"PATH": "/usr/bin:/bin",
                                                             "HOME": str(self.path)})
        return result.stdout

    def patch(self) -> str:
        """The agent's changes as a git patch against the pristine copy, read from the host
        side (module docstring); raises `capture.CaptureError` with git's own line."""
        assert self.snapshots is not None
        return self.snapshots.diff(self.path)

    def _validation_tree(self, folder: Path) -> str | None:
        """The pristine task with the agent's patch applied, built in `folder`; why not, in one
        line (None: built)."""
        assert self.snapshots is not None
        try:
            changes = self.snapshots.changes(self.path)
            refused = refusals(changes, self.task.workspace)
            if refused:
                return refusal_line(refused)
            blobs = [change.new_oid for change in changes if change.status != "D"]
            validation_tree(self.task.workspace, folder, changes, self.snapshots.contents(blobs))
        except CaptureError as exc:  # over the capture's limits, a name git reserves
            return f"validation refused: {exc}"
        except OSError as exc:  # a name the file system refuses
            return f"validation failed: its tree could not be built from the patch ({exc})"
        return None

    def validate(self) -> Validation:
        """Run the task's local validation command, confined like the agent, in a tree built
        from the pristine task and the agent's patch (module docstring); a patch that holds
        more than the task's source files fails in one line naming the path and why. Never
        raises for what the workspace holds."""
        assert self.sandbox is not None
        command = self.task.spec.validation
        judged = UNITTEST.search(command) is not None
        # the canary is a module named on the command line: `discover` takes no module names
        canary = Canary.draw() if judged and "discover" not in command.split() else None
        folder = self._folder(f"compbench-{self.task.id}-validate-")
        try:
            why = self._validation_tree(folder)
            if why is not None:
                return Validation(False, 2, why)
            extra = [canary.module] if canary is not None else []
            if canary is not None:
                (folder / f"{canary.module}.py").write_text(canary.source, encoding="utf-8")
            run = isolated_command(command, extra) or " ".join([command, *extra])
            box = Sandbox(folder, self.limits, level=self.sandbox.confinement,
                          workspace_total=self._mounted.get(folder))
            limits = self.limits.model_copy(update={"output_cap_chars": 200_000})
            timeout = self.task.spec.command_timeout_s * 3
            try:
                got = box.run(run, timeout_s=timeout, limits=limits)
            finally:
                box.close()
        finally:
            self._remove(folder)
        tail = got.output[-VALIDATION_TAIL_CHARS:]
        if got.timed_out:
            return Validation(False, -1, f"validation timed out after {timeout} s: {tail}")
        if not judged:
            return Validation(got.returncode == 0, got.returncode, tail)
        # judged on unittest's own report, the canary's failures included: an exit code alone
        # is set by os._exit or an atexit hook, and a disabled assertion passes every test
        passed, why = unittest_verdict(got.output, got.returncode,
                                       expected_tests(self.task.workspace), canary)
        return Validation(passed, 0 if passed else (got.returncode or 1),
                          tail if passed else f"validation failed: {why}\n{tail}")
