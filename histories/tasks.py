"""Agent tasks: a workspace, an issue text, a step limit and a local validation command.

Repository tasks live in `histories/tasks/<id>/` (a `task.toml` and a `workspace/` folder).
`swebench` tasks describe a SWE-bench instance that runs in mini-swe-agent's docker environment
on a GPU box; where docker is missing they stop with a clear message.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TASK_DIR = Path(__file__).parent / "tasks"


class TaskError(ValueError):
    """A task is unknown, malformed or cannot run on this machine."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: Literal["repo", "swebench"]
    issue: str
    step_limit: int = Field(gt=0)
    validation: str
    fork_turn: int = Field(gt=0, description="assistant turn (1-based) at which histories fork")
    command_timeout_s: int = Field(default=20, gt=0)
    output_cap_chars: int = Field(default=4000, gt=0)
    instance_id: str | None = None
    image: str | None = None


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    root: Path

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def content_hash(self) -> str:
        """sha256 over task.toml and every workspace file (path and bytes), for provenance."""
        digest = hashlib.sha256()
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(self.root)).encode() + b"\0")
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def check_runnable(self) -> None:
        """Raise `TaskError` where this machine cannot run the task."""
        if self.spec.kind == "swebench":
            docker = shutil.which("docker")
            probe = (subprocess.run([docker, "info"], capture_output=True, text=True,
                                    timeout=30, check=False) if docker else None)
            if probe is None or probe.returncode != 0:
                why = "no docker client" if probe is None else probe.stderr.strip()[:200]
                raise TaskError(
                    f"task {self.id} runs in mini-swe-agent's docker environment with image "
                    f"{self.spec.image}, but this machine has no working docker ({why}); run it "
                    "on a GPU box with docker, the image pulled and SWEBENCH_DATASET set")
            raise TaskError(
                f"task {self.id}: SWE-bench runs are driven on a GPU box through mini-swe-agent's "
                "swebench runner; this suite's embedded loop runs repo and decision tasks only")
        if not self.workspace.is_dir():
            raise TaskError(f"task {self.id}: workspace folder {self.workspace} is missing")


def known_tasks() -> list[str]:
    return sorted(p.parent.name for p in TASK_DIR.glob("*/task.toml"))


def runnable_tasks() -> list[str]:
    """Tasks that run here with the embedded model (repository bug-fix tasks)."""
    return [t for t in known_tasks() if load_task(t).spec.kind == "repo"]


def load_task(task_id: str) -> Task:
    path = TASK_DIR / task_id / "task.toml"
    if not path.is_file():
        raise TaskError(f"unknown task '{task_id}'; known tasks: {', '.join(known_tasks())}")
    try:
        spec = TaskSpec.model_validate(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskError(f"{path}: {fields}") from None
    if spec.id != task_id:
        raise TaskError(f"{path}: id '{spec.id}' must match its folder name '{task_id}'")
    return Task(spec=spec, root=path.parent)
