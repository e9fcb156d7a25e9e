"""One agent run's setting, for either kind of task, so acquisition and continuation share one
path: the environment, the model settings, the agent's prompts, where the fork falls, and how
the run is checked at the end.

- repo tasks: a fresh `Workspace` copy with a bash environment; prompts from `histories.agent.loop`;
  the fork is the `fork_turn`-th action turn; validation runs the task's command; the patch is
  the workspace diff.
- decision tasks: no workspace; a `DecisionEnvironment` holds the run's `DecisionSession`; the
  prompts are the task's own messages (the text protocol adds how to write a tool call); the
  fork is the model's call of phase `fork_after` once the phases before it are served;
  validation is the exact final-answer check of the submission; the patch is "".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.loop import agent_settings
from compaction_bench.histories.agent.workspace import Validation, Workspace
from compaction_bench.histories.tasks.decision import DecisionEnvironment, DecisionTask
from compaction_bench.histories.tasks.decision_protocol import (
    FORMAT_ERROR_TEMPLATE,
    OBSERVATION_TEMPLATE,
    structured_regex,
    text_protocol_system,
)
from compaction_bench.histories.tasks.task import Task

NO_BOX = {"level": "not needed", "why": "decision tasks run no command: their tools are served "
                                        "by the suite"}


@dataclass
class Episode:
    """What `HistoryAgent` and the caller need for one run (valid inside `open_episode`)."""

    env: Any  # CappedEnvironment | DecisionEnvironment: mini-swe-agent's Environment protocol
    config: ChatModelConfig
    settings: dict[str, Any]  # DefaultAgent keyword arguments
    patch: Callable[[], str]
    validate: Callable[[str], Validation]  # called with the run's submission
    fork_turn: int | None = None  # repo tasks: the action turn that forks
    fork_at: Callable[[dict[str, Any]], bool] | None = None  # decision tasks: the fork rule
    tools: list[dict[str, Any]] | None = None  # what History.tools records
    provenance: dict[str, Any] = field(default_factory=dict)


def _raw(text: str) -> str:
    """A jinja template that renders to `text` exactly (prompts with JSON braces in them)."""
    return "{% raw %}" + text + "{% endraw %}"


def decision_messages(task: DecisionTask, protocol: str) -> list[dict[str, Any]]:
    """The task's system and user messages; in the text protocol the system message also says
    how to write a tool call, since the tools are not sent to the server."""
    messages = task.initial_messages()
    if protocol == "text":
        messages[0]["content"] = text_protocol_system(messages[0]["content"], task.tools(),
                                                      task.case_id)
    return messages


def decision_config(config: ChatModelConfig, task: DecisionTask, *,
                    final: bool = True) -> ChatModelConfig:
    """`config` with the task's tools, their structured-outputs regex (a FINAL line allowed
    with `final`), and the study's plain tool-result text as observations."""
    tools = task.tools()
    return config.model_copy(update={
        "tools": tools, "structured_regex": structured_regex(tools, final=final),
        "observation_template": OBSERVATION_TEMPLATE,
        "format_error_template": FORMAT_ERROR_TEMPLATE})


def answer_validation(task: DecisionTask, submission: str) -> Validation:
    """The exact answer check, recorded as a validation result with the answer text."""
    passed = task.check_answer(submission)
    return Validation(passed, 0 if passed else 1,
                      f"expected FINAL: {task.final_answer}; "
                      f"{'correct' if passed else 'wrong'}; submission: {submission[-2000:]}")


def decision_fork(env: DecisionEnvironment, phase: int) -> Callable[[dict[str, Any]], bool]:
    """The fork rule: the reply calls phase `phase`'s tool while the phases before it are
    served (checked before the call runs). Its arguments may be wrong: then the pending result
    is the environment's error text, and provenance says `fork_call_correct: false`."""
    name = env.task.phases[phase - 1].name

    def at_fork(message: dict[str, Any]) -> bool:
        names = [a.get("tool_name") for a in message.get("extra", {}).get("actions", [])]
        return env.session.completed == phase - 1 and name in names

    return at_fork


def episode_config(task: Task, config: ChatModelConfig, *, to_fork: bool = False
                   ) -> ChatModelConfig:
    """The model settings a run of `task` uses (`open_episode` hands out the same): decision
    tasks get their tools, regex and templates; repo tasks the config as it is."""
    if task.decision is None:
        return config
    return decision_config(config, task.decision, final=not to_fork)


@contextmanager
def open_episode(task: Task, config: ChatModelConfig, *, step_limit: int | None = None,
                 fork_turn: int | None = None, to_fork: bool = False) -> Iterator[Episode]:
    """The run's setting for `task`; workspaces are removed when the block ends. `fork_turn`
    overrides the task's fork (an action turn; for decision tasks a phase).

    `to_fork` (acquisition): a decision task's fork always comes before its last phase, so a
    final answer before it is never right; in the text protocol the structured-outputs regex
    then leaves the FINAL line out (a 135M model otherwise answers at once), and provenance
    records it as `final_line_allowed: false`. Tool-call servers get no such constraint."""
    limit = step_limit or task.spec.step_limit
    fork = fork_turn or task.spec.fork_turn
    if task.decision is None:
        with Workspace(task) as ws:
            assert ws.env is not None
            assert ws.sandbox is not None
            yield Episode(env=ws.env, config=config,
                          settings=agent_settings(config.protocol, limit), patch=ws.patch,
                          validate=lambda _submission: ws.validate(), fork_turn=fork,
                          provenance={"sandbox": ws.sandbox.describe()})
        return
    decision = task.decision
    env = DecisionEnvironment(decision)
    system, user = decision_messages(decision, config.protocol)
    settings = {**agent_settings(config.protocol, limit),
                "system_template": _raw(system["content"]),
                "instance_template": _raw(user["content"])}
    yield Episode(
        env=env, config=episode_config(task, config, to_fork=to_fork),
        settings=settings,
        patch=lambda: "", validate=lambda submission: answer_validation(decision, submission),
        fork_turn=fork, fork_at=decision_fork(env, fork),
        tools=decision.tools() if config.protocol == "tool_calls" else None,
        provenance={"sandbox": NO_BOX, "fork_after": decision.fork_after,
                    "fork_phase": decision.phases[fork - 1].name,
                    "tasks_json": str(task.root / "tasks.json"),
                    "final_line_allowed": not (to_fork and config.protocol == "text")})
