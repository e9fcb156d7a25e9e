"""A continuation: one arm of a saved history, continued from its fork to a terminal status with
real tool execution, timed the way the study defines postfork marginal time.

Setup (a fresh workspace copy, or a decision task's fresh session, and the replay of the
history's actions) is timed apart and excluded; postfork marginal time runs from just before the
first postfork request to the end of local validation (for decision tasks the exact answer
check), covering model requests, orchestration, tool execution and patch capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minisweagent.exceptions import InterruptAgentFlow

from histories.agent import HistoryAgent
from histories.chat import ChatModel, ChatModelConfig, RequestRecord
from histories.episode import open_episode
from histories.format import History, message_action
from histories.policy import HistoryPolicy
from histories.tasks import Task
from histories.timing import Clock, monotonic
from histories.workspace import Validation


@dataclass(frozen=True)
class ContinuationResult:
    task: str
    arm: str
    terminal_status: str
    submission: str
    turns: int
    setup_s: float
    postfork_s: float  # excludes rewrite_s (the study's definition)
    rewrite_s: float
    started_s: float  # clock value just before the first postfork request
    ended_s: float  # clock value after local validation
    validation: Validation | None
    patch: str
    requests: list[RequestRecord]
    messages: list[dict[str, Any]] = field(repr=False)
    error: str | None = None


def pending_observation(history: History) -> dict[str, Any]:
    """The message that delivers the fork's pending result, in the history's protocol."""
    assert history.fork is not None and history.fork.pending_result is not None
    if history.action_protocol == "tool_calls":
        return {"role": "tool", "tool_call_id": history.fork.action.get("tool_call_id"),
                "content": history.fork.pending_result}
    return {"role": "user", "content": history.fork.pending_result}


def continue_history(history: History, task: Task, config: ChatModelConfig, *,
                     step_limit: int | None = None, clock: Clock = monotonic,
                     policy: HistoryPolicy | None = None,
                     on_request: Callable[[RequestRecord], None] | None = None,
                     ) -> ContinuationResult:
    """Continue `history` from its fork; transport errors are recorded, not raised.

    `policy` (an arm's history policy) prepares the messages before every request; its time is
    reported as `rewrite_s` and excluded from `postfork_s`."""
    if history.fork is None or history.fork.pending_result is None:
        raise ValueError(f"history of task {history.task} (arm {history.arm}) has no fork with a "
                         "pending result; acquire it with `make histories`")
    task.check_runnable()
    prefix = history.messages[: history.fork.message_index + 1]
    with open_episode(task, config, step_limit=step_limit) as episode:
        model = ChatModel(episode.config, clock=clock, policy=policy, on_request=on_request)
        setup_start = clock()
        for message in prefix:  # replay: bring the environment to its state at the fork
            action = message_action(message, history.action_protocol)
            if action is not None:
                with contextlib.suppress(InterruptAgentFlow):
                    episode.env.execute(action)
        setup_s = clock() - setup_start
        agent = HistoryAgent(model, episode.env,
                             seed_messages=[*prefix, pending_observation(history)],
                             **episode.settings)
        start = clock()
        error = None
        try:
            result = agent.run(task.spec.issue)
            status = str(result.get("exit_status", ""))
            submission = str(result.get("submission", ""))
        except Exception as exc:  # the per-arm boundary: record the failure, keep the timing
            error, status, submission = f"{type(exc).__name__}: {exc}", "TransportError", ""
        patch = episode.patch()
        validation = episode.validate(submission)
        ended = clock()
        postfork_s = ended - start - model.rewrite_s
    return ContinuationResult(
        task=task.id, arm=history.arm, terminal_status=status, submission=submission,
        turns=agent.n_calls, setup_s=setup_s, postfork_s=postfork_s, rewrite_s=model.rewrite_s,
        started_s=start, ended_s=ended, validation=validation,
        patch=patch, requests=list(model.records), messages=agent.messages, error=error)
