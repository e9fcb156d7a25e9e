"""A continuation: one arm of a saved history, continued from its fork to a terminal status with
real tool execution, timed the way the study defines postfork marginal time.

Setup (a fresh workspace copy, or a decision task's fresh session, and the replay of the
history's actions) is timed apart and excluded; postfork marginal time runs from just before the
first postfork request to the end of local validation (for decision tasks the exact answer
check), covering model requests, orchestration, tool execution and patch capture.

A continuation never raises for what happens inside it: a failure in setup, the agent loop,
patch capture or validation is recorded with its phase (`error`, `error_phase`) and the timing
so far, so the bench always gets a result to record. `gate`, when given, is called once between
setup and the first request (the bench releases a block's arms together through it).

`wall_time_s` bounds the postfork part: mini-swe-agent's own limit ends the run between steps
(`TimeExceeded`, a terminal status), and a timer cuts a request still in flight when the limit
passes, so no wait outlives it; either way the status is `TimeExceeded` and the time is the
limit's (a censored duration, recorded as such by its status).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from minisweagent.exceptions import InterruptAgentFlow

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.agent.chat import ChatModel, ChatModelConfig, TransportError
from compaction_bench.histories.agent.episode import episode_config, open_episode
from compaction_bench.histories.agent.loop import HistoryAgent
from compaction_bench.histories.agent.workspace import Validation
from compaction_bench.histories.format.history import History, HistoryError, message_action
from compaction_bench.histories.format.invariant import (
    InvariantError,
    InvariantReport,
    compare_bodies,
)
from compaction_bench.histories.format.reasoning import block_text, thought_label
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.histories.tasks.task import Task
from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints
from compaction_bench.transport.client import PreparedRequest, RequestRecord, prepare

WALL_LIMIT = "the arm's wall-time limit passed"


def _wall_timer(model: ChatModel, wall_time_s: float | None) -> threading.Timer | None:
    """A timer that aborts the model's request in flight when the wall-time limit passes."""
    if wall_time_s is None:
        return None
    timer = threading.Timer(wall_time_s, model.client.abort, args=(WALL_LIMIT,))
    timer.daemon = True
    timer.start()
    return timer


@dataclass(frozen=True)
class ContinuationResult:
    task: str
    arm: str
    terminal_status: str
    submission: str
    turns: int
    setup_s: float
    postfork_s: float  # excludes rewrite_s (the study's definition) and helper_wait_s
    rewrite_s: float
    started_s: float  # clock value just before the first postfork request
    ended_s: float  # clock value after local validation
    validation: Validation | None
    patch: str
    requests: list[RequestRecord]
    messages: list[dict[str, Any]] = field(repr=False)
    error: str | None = None
    error_phase: str | None = None  # setup | run | patch | validation
    format_errors: int = 0  # protocol errors the agent answered (FormatError turns)
    first_format_error: str | None = None
    first_body: bytes | None = field(default=None, repr=False)  # the first request as sent
    reasoning_tokens: int | None = None  # postfork reasoning tokens (see reasoning_source)
    reasoning_source: str | None = None  # server-usage | tokenizer | None (not recorded)
    # waiting for a compressor server's lazy start mid-continuation: setup, excluded from both
    # postfork_s and rewrite_s (the other arms of the block ran on meanwhile: see the runner)
    helper_wait_s: float = 0.0


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


def _format_errors(messages: list[dict[str, Any]], start: int) -> tuple[int, str | None]:
    """How many protocol errors the agent answered after message `start`, and the first one."""
    found = [m for m in messages[start:] if (m.get("extra") or {}).get("interrupt_type")
             == "FormatError"]
    first = str(found[0].get("content") or "")[:300] if found else None
    return len(found), first


def _reasoning_tokens(result_messages: list[dict[str, Any]], start: int,
                      records: list[RequestRecord], config: ChatModelConfig
                      ) -> tuple[int | None, str | None]:
    """Postfork reasoning tokens: the server's usage figure where it reports one; for
    tagged-visible reasoning (the visible thought), the thoughts counted with the server's own
    tokenizer; None where neither is available."""
    reported = [r.reasoning_tokens for r in records if r.reasoning_tokens is not None]
    if reported:
        return sum(reported), "server-usage"
    if config.reasoning_mode == "native":
        return None, None
    texts = [block_text(m, config.reasoning_mode, config.protocol)
             for m in result_messages[start:] if m.get("role") == "assistant"]
    try:
        with ServerEndpoints(config.api_url, api_key=config.api_key, timeout_s=120.0) as server:
            return sum(server.count_tokens(config.model_name, thought_label(t)[1])
                       for t in texts), "tokenizer"
    except EndpointError:
        return None, None


def continue_history(history: History, task: Task, config: ChatModelConfig, *,
                     step_limit: int | None = None, clock: Clock = monotonic,
                     policy: HistoryPolicy | None = None,
                     on_request: Callable[[RequestRecord, PreparedRequest], None] | None = None,
                     gate: Callable[[], None] | None = None,
                     wall_time_s: float | None = None,
                     ) -> ContinuationResult:
    """Continue `history` from its fork; failures are recorded, not raised (module docstring).

    `policy` (an arm's history policy) prepares the messages before every request; its time is
    reported as `rewrite_s` and excluded from `postfork_s`."""
    if history.fork is None or history.fork.pending_result is None:
        raise HistoryError(f"history of task {history.task} (arm {history.arm}) has no fork with "
                           "a pending result; acquire it with `make histories`")
    task.check_runnable()
    prefix = history.messages[: history.fork.message_index + 1]
    seeded = [*prefix, pending_observation(history)]
    model = ChatModel(episode_config(task, config), clock=clock, policy=policy,
                      on_request=on_request)
    error: str | None = None
    phase: str | None = None
    status, submission, patch, validation = "SetupError", "", "", None
    messages: list[dict[str, Any]] = list(seeded)
    turns, setup_s = 0, 0.0
    start = ended = clock()
    released = False
    try:
        with open_episode(task, config, step_limit=step_limit) as episode:
            model.config = episode.config
            setup_start = clock()
            try:
                for message in prefix:  # replay: bring the environment to its state at the fork
                    action = message_action(message, history.action_protocol)
                    if action is not None:
                        with contextlib.suppress(InterruptAgentFlow):
                            episode.env.execute(action)
            except Exception as exc:
                error, phase = f"{type(exc).__name__}: {exc}", "setup"
            setup_s = clock() - setup_start
            if gate is not None:
                released = True
                gate()
            start = clock()
            settings = dict(episode.settings)
            if wall_time_s is not None:
                settings["wall_time_limit_seconds"] = max(1, math.ceil(wall_time_s))
            agent = HistoryAgent(model, episode.env, seed_messages=seeded, **settings)
            if error is None:
                timer = _wall_timer(model, wall_time_s)
                try:
                    result = agent.run(task.spec.issue)
                    status = str(result.get("exit_status", ""))
                    submission = str(result.get("submission", ""))
                except Exception as exc:  # the per-arm boundary: record, keep the timing
                    if timer is not None and timer.finished.is_set() and isinstance(
                            exc, TransportError):
                        status = "TimeExceeded"  # the limit cut the request in flight
                    else:
                        error, phase = f"{type(exc).__name__}: {exc}", "run"
                        status = ("TransportError" if isinstance(exc, TransportError)
                                  else "AgentError")
                finally:
                    if timer is not None:
                        timer.cancel()
            messages, turns = agent.messages or messages, agent.n_calls
            try:
                patch = episode.patch()
            except Exception as exc:
                error, phase = error or f"patch capture: {type(exc).__name__}: {exc}", (
                    phase or "patch")
            try:
                validation = episode.validate(submission)
            except Exception as exc:
                error, phase = error or f"validation: {type(exc).__name__}: {exc}", (
                    phase or "validation")
            ended = clock()
    except Exception as exc:  # the workspace itself (copy, git init, clean-up) failed
        error, phase = error or f"{type(exc).__name__}: {exc}", phase or "setup"
        ended = clock()
    finally:
        if gate is not None and not released:
            gate()  # never leave the block waiting on an arm whose setup failed
        model.close()
    count, first = _format_errors(messages, len(seeded))
    reasoning, source = _reasoning_tokens(messages, len(seeded), model.records, model.config)
    return ContinuationResult(
        task=task.id, arm=history.arm, terminal_status=status, submission=submission,
        turns=turns, setup_s=setup_s,
        postfork_s=ended - start - model.rewrite_s - model.waited_s,
        rewrite_s=model.rewrite_s, started_s=start, ended_s=ended, validation=validation,
        patch=patch, requests=list(model.records), messages=messages, error=error,
        error_phase=phase, format_errors=count, first_format_error=first,
        first_body=model.first_body, reasoning_tokens=reasoning, reasoning_source=source,
        helper_wait_s=model.waited_s)
