"""Agent tasks: a workspace, an issue text, a step limit and a local validation command.

Repository tasks live in `data/tasks/<id>/` (a `task.toml` and a `workspace/` folder; the root
is `common.paths.tasks_root()`). `swebench` tasks describe a SWE-bench instance that runs in
mini-swe-agent's docker environment on a GPU box; where docker is missing they stop with a
clear message. `decision` tasks are the study's controlled tool tasks from the shipped
`data/study/tasks.json` (see `histories.tasks.decision`): no workspace, tools served
deterministically, an exact answer check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.paths import tasks_root
from compaction_bench.histories.tasks.decision import (
    DecisionTask,
    DecisionTaskError,
    default_tasks_path,
    load_decision_tasks,
)


class TaskError(SuiteError):
    """A task is unknown, malformed or cannot run on this machine."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: Literal["repo", "swebench", "decision"]
    issue: str
    step_limit: int = Field(gt=0)
    validation: str
    fork_turn: int = Field(gt=0, description="assistant turn (1-based) at which histories fork; "
                           "for decision tasks the phase whose call is pending (fork_after)")
    command_timeout_s: int = Field(default=20, gt=0)
    output_cap_chars: int = Field(default=4000, gt=0)
    instance_id: str | None = None
    image: str | None = None


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    root: Path
    decision: DecisionTask | None = None  # set for kind "decision"

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def content_hash(self) -> str:
        """sha256 over task.toml and every workspace file (path and bytes), for provenance; for a
        decision task, over its tasks.json entry as loaded."""
        if self.decision is not None:
            text = json.dumps(dataclasses.asdict(self.decision), sort_keys=True,
                              separators=(",", ":"), ensure_ascii=False)
            return hashlib.sha256(text.encode()).hexdigest()
        digest = hashlib.sha256()
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(self.root)).encode() + b"\0")
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def check_runnable(self) -> None:
        """Raise `TaskError` where this machine cannot run the task."""
        if self.spec.kind == "decision":
            if not (self.root / "tasks.json").is_file():
                raise TaskError(f"task {self.id}: {self.root / 'tasks.json'} is missing; the "
                                "project ships it in data/study/ (restore it with git)")
            return
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


def _decision_tasks() -> dict[str, DecisionTask]:
    """The study's decision tasks (none where data/study/tasks.json was removed)."""
    if not default_tasks_path().is_file():
        return {}
    try:
        return load_decision_tasks(default_tasks_path())
    except DecisionTaskError as exc:
        raise TaskError(str(exc)) from None


def known_tasks() -> list[str]:
    """Repository and SWE-bench tasks under data/tasks, then the decision tasks."""
    return sorted(p.parent.name for p in tasks_root().glob("*/task.toml")) + sorted(
        _decision_tasks())


# Decision tasks are left out: with the embedded SmolLM2 135M (text protocol, structured
# outputs) acquisition did not reach the study's fork (phase 3's call) in 7 of 7 bounded tries
# (all four tasks, step limit 12): the model repeats a served call or invents case ids. They
# run by explicit id: `make histories TASK=<id>` with a tool-calling model, or `--fork-turn 1`.
RUNNABLE_KINDS = ("repo",)


def runnable_tasks() -> list[str]:
    """Tasks `make histories` acquires with the embedded model: repository bug-fix tasks.
    Decision tasks run by explicit id (TASK=<id>); see RUNNABLE_KINDS and the note there."""
    return [t for t in known_tasks() if load_task(t).spec.kind in RUNNABLE_KINDS]


def decision_task(task: DecisionTask) -> Task:
    """A decision task as a `Task`: the issue is its user prompt, the fork its `fork_after`."""
    spec = TaskSpec(id=task.id, kind="decision", issue=task.user_prompt,
                    step_limit=2 * (len(task.phases) + 1),
                    validation="exact final-answer check (histories.tasks.decision."
                               "final_answer_correct)",
                    fork_turn=task.fork_after)
    return Task(spec=spec, root=default_tasks_path().parent, decision=task)


def load_task(task_id: str) -> Task:
    path = tasks_root() / task_id / "task.toml"
    if not path.is_file():
        decisions = _decision_tasks()
        if task_id in decisions:
            return decision_task(decisions[task_id])
        note = "" if decisions else (f" (decision tasks are read from {default_tasks_path()}, "
                                     "which is missing: restore it with git)")
        raise TaskError(f"unknown task '{task_id}'; known tasks: "
                        f"{', '.join(known_tasks())}{note}")
    try:
        spec = TaskSpec.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TaskError(f"{path}: {fields}") from None
    if spec.id != task_id:
        raise TaskError(f"{path}: id '{spec.id}' must match its folder name '{task_id}'")
    return Task(spec=spec, root=path.parent)
