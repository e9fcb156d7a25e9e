"""A decision task with the embedded model (text protocol, structured outputs) against the real
vLLM CPU server: acquisition to a fork and a continuation to a terminal status.

SmolLM2 135M does not reach the study's fork (phase 3's call) within the step limit: it repeats
a call or invents case ids. So the fork here is phase 1's call (`fork_turn=1`), which is enough
to run the whole path for real: the structured-outputs regex, the JSON text action, the
deterministic environment, the history file, replay and the exact answer check."""

from __future__ import annotations

import json

import pytest

from compaction_bench.histories.agent.acquisition import acquire
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.format.history import History
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.serve.launcher import Server
from compaction_bench.serve.profile import load_profile

pytestmark = pytest.mark.integration
TASK = "wildfire-evacuation"


def test_decision_task_acquires_and_continues_with_the_embedded_model(
        cpu_server: Server) -> None:
    task = load_task(TASK)
    assert task.decision is not None
    config = config_for_profile(load_profile("cpu-tiny"), cpu_server.api_url, seed=0)
    got = acquire(task, config, fork_turn=1, provenance={"profile": "cpu-tiny"})
    history = History.from_json(got.history.to_json(), origin="acquired")
    assert history.fork is not None and history.action_protocol == "text"
    fork_message = history.messages[history.fork.message_index]
    call = json.loads(fork_message["content"].split("```json\n")[1].split("\n```")[0])
    assert call["name"] == task.decision.phases[0].name
    assert history.provenance["structured_text"] is True
    assert history.provenance["final_line_allowed"] is False
    # the pending result is the environment's deterministic answer to that call
    session = task.decision.session()
    assert history.fork.pending_result == session.execute(call["name"], call["arguments"])

    result = continue_history(history, task, config, step_limit=3)
    assert result.error is None
    assert result.terminal_status in {"Submitted", "LimitsExceeded", "RepeatedFormatError"}
    assert result.requests and all(r.status == "ok" and r.completion_tokens
                                   for r in result.requests)
    assert result.messages[: history.fork.message_index + 1] == history.messages
    assert result.validation is not None and result.patch == ""
    assert result.validation.passed == task.decision.check_answer(result.submission)
