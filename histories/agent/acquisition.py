"""Acquisition: run the agent on a task against the served target up to a fork, and save the
clean history with its provenance."""

from __future__ import annotations

import contextlib
import platform
import time
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from minisweagent.exceptions import InterruptAgentFlow

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.agent.chat import ChatModel, ChatModelConfig
from compaction_bench.histories.agent.episode import open_episode
from compaction_bench.histories.agent.loop import FORKED, HistoryAgent
from compaction_bench.histories.format.history import Fork, History
from compaction_bench.histories.tasks.task import Task
from compaction_bench.serve.endpoints import server_version


class AcquisitionError(SuiteError):
    """The agent ended before reaching the requested fork."""


@dataclass(frozen=True)
class Acquired:
    history: History
    requests: list[dict[str, Any]]


def acquire(task: Task, config: ChatModelConfig, *, fork_turn: int | None = None,
            provenance: dict[str, Any] | None = None) -> Acquired:
    """Run `task` until the model requests its fork-turn action; execute that action once to
    record the pending result every arm receives after the fork."""
    task.check_runnable()
    turn = fork_turn or task.spec.fork_turn
    with open_episode(task, config, fork_turn=fork_turn, to_fork=True) as episode, \
            contextlib.closing(ChatModel(episode.config)) as model:  # closes its kept-alive socket
        config = episode.config
        fork_at = episode.fork_at
        agent = HistoryAgent(model, episode.env, fork_turn=turn, fork_at=fork_at,
                             **episode.settings)
        started = time.time()
        result = agent.run(task.spec.issue)
        status = result.get("exit_status")
        if status != FORKED:
            where = (f"phase {turn}'s call" if fork_at is not None else f"turn {turn}")
            raise AcquisitionError(
                f"task {task.id}: the agent ended with {status} after {agent.action_turns} "
                f"action turn(s), before the fork at {where}; try another seed or an "
                "earlier fork (--fork-turn)")
        messages = agent.messages[:-1]  # drop the Forked exit marker
        fork_message = messages[-1]
        actions = fork_message["extra"]["actions"]
        # the fork's action: the pending phase call where the fork rule names one
        action = next((a for a in actions if fork_at is not None
                       and a.get("tool_name") == episode.provenance.get("fork_phase")),
                      actions[0])
        try:
            outputs = [episode.env.execute(action)]
        except InterruptAgentFlow as flow:  # the pending action is the submit command
            outputs = [{"output": flow.messages[0].get("content", ""), "returncode": 0,
                        "exception_info": ""}]
        observation = model.format_observation_messages(fork_message, outputs,
                                                        agent.get_template_vars())
        extra: dict[str, Any] = dict(episode.provenance)
        if task.decision is not None:
            want = task.decision.phases[turn - 1]
            extra["fork_call_correct"] = outputs[0]["returncode"] == 0 and \
                action.get("tool_name") == want.name
    history = History(
        messages=messages, task=task.id, arm="clean", reasoning_mode=config.reasoning_mode,
        action_protocol=config.protocol,
        fork=Fork(message_index=len(messages) - 1, action=action,
                  pending_result=observation[0]["content"]),
        info=agent.serialize()["info"], tools=episode.tools,
        provenance={
            "model": config.model_name, "api_url": config.api_url,
            "server_version": server_version(config.api_url),
            "task_sha256": task.content_hash(), "fork_turn": turn,
            "sampling": {"temperature": config.temperature, "top_p": config.top_p,
                         "top_k": config.top_k, "max_tokens": config.max_tokens,
                         "seed": config.seed},
            "structured_text": config.structured_text and config.protocol == "text",
            "mini_swe_agent": version("mini-swe-agent"), "host": platform.node(),
            "acquired_at": started, "model_requests": len(model.records),
            **extra, **(provenance or {}),
        },
    )
    return Acquired(history=history, requests=[r.to_json() for r in model.records])
