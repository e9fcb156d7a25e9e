"""A continuation: one arm of a saved history, continued from its fork to a terminal status with
real tool execution, timed the way the study defines postfork marginal time.

Setup (a fresh workspace copy, or a decision task's fresh session, and the replay of the
history's actions) is timed apart and excluded; postfork marginal time runs from just before the
first postfork request to the end of local validation (for decision tasks the exact answer
check), covering model requests, orchestration, tool execution and patch capture.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from minisweagent.exceptions import InterruptAgentFlow

from common.timing import Clock, monotonic
from histories.agent.chat import ChatModel, ChatModelConfig
from histories.agent.episode import episode_config, open_episode
from histories.agent.loop import HistoryAgent
from histories.agent.workspace import Validation
from histories.format.history import History, HistoryError, message_action
from histories.format.invariant import InvariantError, InvariantReport, compare_bodies
from histories.policies.base import HistoryPolicy
from histories.tasks.task import Task
from loadgen.client import PreparedRequest, RequestRecord, prepare


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


def default_config(history: History) -> ChatModelConfig:
    """Settings that render a history's requests when no run config is at hand (audits, arm
    writing): its own protocol and reasoning mode; nothing is sent with them."""
    return ChatModelConfig(
        api_url="http://invariant-check.invalid/v1",
        protocol=cast(Literal["tool_calls", "text"], history.action_protocol),
        reasoning_mode=cast(Literal["native", "tagged-visible"], history.reasoning_mode),
        structured_text=bool(history.provenance.get("structured_text", False)))


def first_request(history: History, config: ChatModelConfig | None = None, *,
                  task: Task | None = None, policy: HistoryPolicy | None = None
                  ) -> PreparedRequest:
    """The first postfork request exactly as `continue_history` would send it with the same
    `config`, `task` and `policy` (a fresh one: `prepare` may keep state): wire messages through
    the pending observation, sampling, tools, extra body. Nothing is sent."""
    if history.fork is None or history.fork.pending_result is None:
        raise InvariantError(f"arm {history.arm} of task {history.task}: no fork with a pending "
                             "result, so there is no first postfork request to compare")
    cfg = config or default_config(history)
    if task is not None:
        cfg = episode_config(task, cfg)
    model = ChatModel(cfg)
    prefix = history.messages[: history.fork.message_index + 1]
    messages = [*prefix, pending_observation(history)]
    if policy is not None:
        messages = policy.prepare(messages)
    body = model.request_body(model.api_messages(messages))
    if history.tools is not None and cfg.protocol == "tool_calls" and cfg.tools is None:
        body["tools"] = history.tools
    return prepare(cfg.api_url, body, request_id="invariant-check", api_key=None)


def check_reasoning_only(clean: History, arm: History, config: ChatModelConfig | None = None, *,
                         task: Task | None = None, clean_policy: HistoryPolicy | None = None,
                         arm_policy: HistoryPolicy | None = None) -> InvariantReport:
    """The invariant on the bodies each arm would put on the wire (see `first_request`);
    raises `InvariantError` naming the first field outside reasoning that differs."""
    if clean.fork is not None and arm.fork is not None and clean.fork.action != arm.fork.action:
        raise InvariantError(f"arm {arm.arm} of task {arm.task}: field extra.fork.action differs "
                             "from clean's (the fork's pending action must be shared)")
    sent_c = first_request(clean, config, task=task, policy=clean_policy)
    sent_a = first_request(arm, config, task=task, policy=arm_policy)
    return compare_bodies(json.loads(sent_c.body), json.loads(sent_a.body), arm_name=arm.arm,
                          task=arm.task, reasoning_mode=clean.reasoning_mode,
                          protocol=clean.action_protocol, clean_sha256=sent_c.body_sha256,
                          arm_sha256=sent_a.body_sha256)


def continue_history(history: History, task: Task, config: ChatModelConfig, *,
                     step_limit: int | None = None, clock: Clock = monotonic,
                     policy: HistoryPolicy | None = None,
                     on_request: Callable[[RequestRecord, PreparedRequest], None] | None = None,
                     ) -> ContinuationResult:
    """Continue `history` from its fork; transport errors are recorded, not raised.

    `policy` (an arm's history policy) prepares the messages before every request; its time is
    reported as `rewrite_s` and excluded from `postfork_s`."""
    if history.fork is None or history.fork.pending_result is None:
        raise HistoryError(f"history of task {history.task} (arm {history.arm}) has no fork with a "
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
        model.close()
    return ContinuationResult(
        task=task.id, arm=history.arm, terminal_status=status, submission=submission,
        turns=agent.n_calls, setup_s=setup_s, postfork_s=postfork_s, rewrite_s=model.rewrite_s,
        started_s=start, ended_s=ended, validation=validation,
        patch=patch, requests=list(model.records), messages=agent.messages, error=error)
