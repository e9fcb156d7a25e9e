"""A fresh per-run copy of a task's workspace, where agent tool commands run.

Each run gets its own copy (made a git repository so the patch can be captured), commands run
with a timeout (the whole process group is killed) and their output is capped. The copy is
removed when the run ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig

from histories.tasks.task import Task

# Tool commands get a small, fixed environment: no secrets from the caller's environment.
SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TERM", "TZ")


class CappedEnvironmentConfig(LocalEnvironmentConfig):
    output_cap_chars: int = 4000


class CappedEnvironment(LocalEnvironment):
    """mini-swe-agent's local environment, with a minimal environment (no secrets of the caller)
    and an output cap."""

    config: CappedEnvironmentConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(config_class=CappedEnvironmentConfig, **kwargs)

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Run one command; same result shape and submission check as mini-swe-agent's."""
        env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
        env |= {"HOME": self.config.cwd, "PAGER": "cat"} | self.config.env
        limit = timeout or self.config.timeout
        proc = subprocess.Popen(action.get("command", ""), shell=True, text=True,
                                cwd=cwd or self.config.cwd, env=env, encoding="utf-8",
                                errors="replace", stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=limit)
            output: dict[str, Any] = {"output": text, "returncode": proc.returncode,
                                      "exception_info": ""}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: no orphaned children
            text, _ = proc.communicate()
            output = {"output": text or "", "returncode": -1,
                      "exception_info": f"the command timed out after {limit} s and was killed",
                      "extra": {"exception_type": "TimeoutExpired"}}
        cap = self.config.output_cap_chars
        if len(output["output"]) > cap:
            output["output"] = (output["output"][:cap] + f"\n[output truncated: {cap} of "
                                f"{len(output['output'])} characters shown]")
        self._check_finished(output)
        return output


@dataclass
class Validation:
    passed: bool
    returncode: int
    output: str


class Workspace:
    """`with Workspace(task) as ws:` gives a fresh copy and an environment running in it."""

    def __init__(self, task: Task, base_dir: Path | None = None) -> None:
        self.task = task
        self.base_dir = base_dir
        self.path = Path()
        self.env: CappedEnvironment | None = None

    def __enter__(self) -> Workspace:
        self.path = Path(tempfile.mkdtemp(prefix=f"compbench-{self.task.id}-", dir=self.base_dir))
        shutil.copytree(self.task.workspace, self.path, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        self._git("init", "-q")
        self._git("add", "-A")
        self._git("-c", "user.name=compbench", "-c", "user.email=compbench@localhost",
                  "commit", "-q", "-m", "task workspace")
        self.env = CappedEnvironment(cwd=str(self.path), timeout=self.task.spec.command_timeout_s,
                                     output_cap_chars=self.task.spec.output_cap_chars)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _git(self, *args: str) -> str:
        result = subprocess.run(["git", *args], cwd=self.path, capture_output=True, text=True,
                                timeout=60, check=True)
        return result.stdout

    def patch(self) -> str:
        """The agent's changes as a diff against the task's workspace."""
        self._git("add", "-A")
        return self._git("diff", "--cached")

    def validate(self) -> Validation:
        """Run the task's local validation command in this copy."""
        try:
            result = subprocess.run(self.task.spec.validation, shell=True, cwd=self.path,
                                    capture_output=True, text=True, check=False,
                                    timeout=self.task.spec.command_timeout_s * 3)
        except subprocess.TimeoutExpired as exc:
            return Validation(False, -1, f"validation timed out: {exc}")
        return Validation(result.returncode == 0, result.returncode,
                          (result.stdout + result.stderr)[-4000:])
