"""The agent loop: mini-swe-agent's `DefaultAgent`, plus starting from saved messages and
stopping at a fork. Prompts for the two action protocols live here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minisweagent.agents.default import DefaultAgent
from minisweagent.exceptions import InterruptAgentFlow

from compaction_bench.histories.agent.chat import ChatModel

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
FORKED = "Forked"

SYSTEM_TEXT = """You are a software engineer fixing a bug in a small Python repository.
Reply with a THOUGHT line and then one bash command in a fenced block, like this:

THOUGHT: I need to see which files the repository has.

```bash
ls
```

The command runs in the repository folder; its output comes in the next message."""

SYSTEM_TOOLS = """You are a software engineer fixing a bug in a small repository. Think about the
next step, then call the bash tool with exactly one command. It runs in the repository folder and
you see its output in the next message."""

INSTANCE = """Fix this issue in the repository in the current folder:

{{task}}

Work one command at a time: read the files, edit them (for example with sed or a heredoc), run
the tests. When the tests pass, submit by running exactly `""" + SUBMIT + """` on its own."""


def agent_settings(protocol: str, step_limit: int) -> dict[str, Any]:
    """`DefaultAgent` keyword arguments for an action protocol."""
    return {
        "system_template": SYSTEM_TOOLS if protocol == "tool_calls" else SYSTEM_TEXT,
        "instance_template": INSTANCE,
        "step_limit": step_limit,
        "cost_limit": 0.0,  # the local server charges nothing; step_limit bounds the run
        "max_consecutive_format_errors": 3,
    }


class HistoryAgent(DefaultAgent):
    """`DefaultAgent` that can (a) start from saved messages instead of rendering the system and
    task messages, and (b) stop at a fork: right after the model requests its `fork_turn`-th
    action, before that action runs. The fork ends the run with exit status `Forked`.

    `fork_at(message)`, where given, decides the fork instead of the turn count (decision tasks
    fork at the call of a given phase, however many turns it took to get there). `env` is any
    mini-swe-agent environment: a `CappedEnvironment` or a `DecisionEnvironment`."""

    def __init__(self, model: ChatModel, env: Any, *,
                 seed_messages: list[dict[str, Any]] | None = None,
                 fork_turn: int | None = None,
                 fork_at: Callable[[dict[str, Any]], bool] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model, env, **kwargs)
        self._seed = seed_messages
        self.fork_turn = fork_turn
        self.fork_at = fork_at
        self.action_turns = 0

    def add_messages(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        # DefaultAgent.run() starts by adding the rendered system and task messages; a
        # continuation replaces that first call with the saved history.
        if self._seed is not None:
            messages, self._seed = tuple(self._seed), None
        return super().add_messages(*messages)

    def step(self) -> list[dict[str, Any]]:
        message = self.query()
        if message.get("extra", {}).get("actions"):
            self.action_turns += 1
            forked = (self.fork_at(message) if self.fork_at is not None
                      else self.action_turns == self.fork_turn)
            if forked:
                raise InterruptAgentFlow(
                    {"role": "exit", "content": FORKED,
                     "extra": {"exit_status": FORKED, "submission": ""}})
        return self.execute_actions(message)
