"""Decision tasks: loading, tool schemas, deterministic results and errors, the exact answer
check, and the mini-swe-agent-compatible environment. Runs on the study's real tasks.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import study_root
from compaction_bench.histories.format.history import Fork, History
from compaction_bench.histories.tasks.decision import (
    SUBMIT_TOOL,
    DecisionEnvironment,
    DecisionSubmitted,
    DecisionTask,
    DecisionTaskError,
    final_answer_correct,
    load_decision_task,
    load_decision_tasks,
    result_text,
    system_prompt,
    tool_schema,
)

STUDY_DIR = study_root() / "records"
TASK_IDS = ["wildfire-evacuation", "data-center-recovery", "orbital-observation",
            "manufacturing-recall"]


@pytest.fixture
def wildfire() -> DecisionTask:
    return load_decision_task("wildfire-evacuation")


def args(task: DecisionTask, index: int) -> str:
    return json.dumps(task.phases[index].expected_arguments)


def test_all_four_tasks_load() -> None:
    tasks = load_decision_tasks()
    assert sorted(tasks) == sorted(TASK_IDS)
    for task in tasks.values():
        assert 0 < task.fork_after < len(task.phases)
        assert len(task.tools()) == len(task.phases) + 1
        assert task.tools()[-1]["function"]["name"] == task.distractor["name"]


def test_missing_file_and_unknown_task_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DecisionTaskError, match=r"nowhere\.json: no decision-task file here"):
        load_decision_tasks(tmp_path / "nowhere.json")
    with pytest.raises(DecisionTaskError, match=r"no task 'x' \(tasks: data-center-recovery"):
        load_decision_task("x")
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps([{"id": "t"}]))
    with pytest.raises(DecisionTaskError, match="task 't': field 'title' must be str, got nothing"):
        load_decision_tasks(bad)


def test_prompts_and_schemas_reproduce_the_studys_requests() -> None:
    """The study's v2 vaccine record was built by the same rules: rebuild its system prompt and
    tool schemas (key order included) from the names and descriptions it contains."""
    record = next(STUDY_DIR.glob("*vaccine-decision-v2__rep-*.json"), None)
    assert record is not None, f"{STUDY_DIR} lacks the study's vaccine record (incomplete data)"
    request = json.loads(record.read_text())["branches"]["clean"]["turns"][0]["request"]
    names = [t["function"]["name"] for t in request["tools"][:-1]]
    assert request["messages"][0]["content"] == system_prompt(names)
    for tool in request["tools"]:
        function = function_of(tool)
        lists = [k for k in function["parameters"]["properties"] if k != "case_id"]
        count = function["parameters"]["properties"][lists[0]]["maxItems"] if lists else None
        rebuilt = tool_schema(function["name"], function["description"],
                              lists[0] if lists else None, count)
        assert json.dumps(rebuilt) == json.dumps(tool)


def function_of(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = tool["function"]
    return function


def test_initial_messages_and_fork_info(wildfire: DecisionTask) -> None:
    system, user = wildfire.initial_messages()
    assert "load_evacuation_brief -> list_evacuation_portfolios" in system["content"]
    assert user["content"].startswith("Case ID: FIRE-41.\nSelect the evacuation portfolio")
    info = wildfire.fork_info()
    assert wildfire.fork_phase.name == info["pending_phase"] == "stress_test_evacuation_portfolios"
    assert info["postfork_phases"] == ["get_live_road_closure_update",
                                       "get_binding_transport_quotes"]
    assert json.loads(info["pending_result"]) == wildfire.phases[2].result


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_the_expected_run_succeeds(task_id: str) -> None:
    task = load_decision_task(task_id)
    session = task.session()
    for index, phase in enumerate(task.phases):
        output = session.execute(phase.name, args(task, index))
        assert output == result_text(phase.result)
    assert session.done and session.actions_correct
    assert task.check_answer(f"Reasoning.\nFINAL: {task.final_answer}")


def test_results_are_the_studys_compact_sorted_json(wildfire: DecisionTask) -> None:
    output = wildfire.session().execute("load_evacuation_brief", {"case_id": "FIRE-41"})
    assert output.startswith('{"case_id":"FIRE-41","decision_rule":["Discard every plan')
    assert output == json.dumps(wildfire.phases[0].result, sort_keys=True,
                                separators=(",", ":"), ensure_ascii=False)


def test_list_arguments_match_in_any_order(wildfire: DecisionTask) -> None:
    session = wildfire.session()
    session.fast_forward(2)
    ids = list(reversed(wildfire.phases[2].expected_arguments["portfolio_ids"]))
    output = session.execute("stress_test_evacuation_portfolios",
                             {"case_id": "FIRE-41", "portfolio_ids": ids})
    assert output == result_text(wildfire.phases[2].result) and session.actions_correct


@pytest.mark.parametrize(("name", "arguments", "error"), [
    ("get_live_road_closure_update", '{"case_id": "FIRE-41", "finalist_ids": ["E2", "E4"]}',
     "phase_not_available"),
    ("load_evacuation_brief", '{"case_id": "FIRE-99"}', "invalid_arguments"),
    ("load_evacuation_brief", '{"case_id": "FIRE-41", "extra": 1}', "invalid_arguments"),
    ("load_evacuation_brief", "{not json", "invalid_arguments"),
    ("load_evacuation_brief", "[1, 2]", "invalid_arguments"),
    ("delete_everything", "{}", "unknown_tool"),
])
def test_wrong_calls_get_a_deterministic_error(wildfire: DecisionTask, name: str,
                                               arguments: str, error: str) -> None:
    first, second = wildfire.session(), wildfire.session()
    output = first.execute(name, arguments)
    assert output == second.execute(name, arguments)
    assert json.loads(output)["error"] == error
    assert not first.actions_correct and first.completed == 0
    assert "E2" not in json.loads(output)["message"]  # never leaks the expected ids


def test_premature_error_names_the_phase_to_do_first(wildfire: DecisionTask) -> None:
    output = wildfire.session().execute("get_binding_transport_quotes", "{}")
    assert json.loads(output)["message"] == ("get_binding_transport_quotes is phase 5; complete "
                                             "phase 1 (load_evacuation_brief) first.")


def test_distractor_answers_but_breaks_the_action_record(wildfire: DecisionTask) -> None:
    session = wildfire.session()
    output = session.execute("request_evacuation_waiver", {"case_id": "FIRE-41"})
    assert json.loads(output) == {"authorized": False}
    assert not session.actions_correct


def test_repeating_a_done_phase_returns_the_same_result(wildfire: DecisionTask) -> None:
    session = wildfire.session()
    first = session.execute("load_evacuation_brief", args(wildfire, 0))
    assert session.execute("load_evacuation_brief", args(wildfire, 0)) == first
    assert session.completed == 1 and not session.actions_correct


@pytest.mark.parametrize(("text", "ok"), [
    ("FINAL: E2", True), ("Analysis...\n\n**FINAL: E2**", True), ("final: e2", True),
    ("FINAL: E4", False), ("FINAL: E2\nThanks", False), ("FINAL: E2\nFINAL: E2", False),
    ("The answer is E2", False), ("", False), (None, False), ("FINAL: E22", False),
])
def test_exact_final_answer_check(text: str | None, ok: bool) -> None:
    assert final_answer_correct(text, "E2") is ok


def test_environment_serves_tool_calls_and_the_fork_action_form(wildfire: DecisionTask) -> None:
    env = DecisionEnvironment(wildfire)
    result = env.execute({"tool_name": "load_evacuation_brief", "arguments": args(wildfire, 0),
                          "tool_call_id": "c1"})
    assert result == {"output": result_text(wildfire.phases[0].result), "returncode": 0,
                      "exception_info": ""}
    fork_form = {"command": args(wildfire, 1), "tool_name": "list_evacuation_portfolios"}
    assert env.execute(fork_form)["returncode"] == 0
    assert env.execute({"tool_name": "nope", "arguments": "{}"})["returncode"] == 1
    served = env.serialize()["info"]
    assert served["config"]["environment_type"] == (
        "compaction_bench.histories.tasks.decision.DecisionEnvironment")
    assert served["decision"]["phases_completed"] == 2
    assert env.get_template_vars(extra=1)["case_id"] == "FIRE-41"


def test_environment_text_actions(wildfire: DecisionTask) -> None:
    env = DecisionEnvironment(wildfire)
    fenced = ('I will load the brief.\n```json\n{"name": "load_evacuation_brief", '
              '"arguments": {"case_id": "FIRE-41"}}\n```')
    assert env.execute({"command": fenced})["returncode"] == 0
    missing = env.execute({"command": "just thinking"})
    assert missing["returncode"] == 1 and json.loads(missing["output"])["error"] == "no_tool_call"


def test_final_answer_ends_the_run_with_minisweagents_exit_message(
        wildfire: DecisionTask) -> None:
    env = DecisionEnvironment(wildfire)
    for index, phase in enumerate(wildfire.phases):
        env.execute({"tool_name": phase.name, "arguments": args(wildfire, index)})
    with pytest.raises(DecisionSubmitted) as caught:
        env.execute({"command": "E2 keeps every constraint.\nFINAL: E2"})
    (exit_message,) = caught.value.messages
    assert exit_message["role"] == "exit"
    assert exit_message["extra"]["exit_status"] == "Submitted"
    assert exit_message["extra"]["submission"] == "E2 keeps every constraint.\nFINAL: E2"
    assert exit_message["extra"]["final_correct"] and exit_message["extra"]["actions_correct"]
    with pytest.raises(DecisionSubmitted) as wrong:
        env.execute({"final_answer": "FINAL: E4"})
    assert wrong.value.messages[0]["extra"]["final_correct"] is False


def test_optional_submit_tool(wildfire: DecisionTask) -> None:
    env = DecisionEnvironment(wildfire, final_tool=True)
    assert env.tools()[-1]["function"]["name"] == SUBMIT_TOOL
    assert SUBMIT_TOOL not in [t["function"]["name"] for t in DecisionEnvironment(
        wildfire).tools()]
    with pytest.raises(DecisionSubmitted) as caught:
        env.execute({"tool_name": SUBMIT_TOOL, "arguments": '{"answer": "FINAL: E2"}'})
    assert caught.value.messages[0]["extra"]["final_correct"] is True


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_a_scripted_run_to_the_fork_is_a_valid_history(task_id: str) -> None:
    """Serve the phases before the fork through the environment, stop at the fork's call: the
    result is a history file whose pending result is the task's fork result."""
    task = load_decision_task(task_id)
    env = DecisionEnvironment(task)
    messages: list[dict[str, Any]] = task.initial_messages()
    for index in range(task.fork_after):
        phase = task.phases[index]
        call_id = f"call_{index}"
        messages.append({"role": "assistant", "content": None, "reasoning": f"Phase {index + 1}.",
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": phase.name, "arguments": args(task, index)}}]})
        if index + 1 < task.fork_after:
            output = env.execute({"tool_name": phase.name, "arguments": args(task, index)})
            messages.append({"role": "tool", "tool_call_id": call_id, "name": phase.name,
                             "content": output["output"]})
    fork_action = {"command": args(task, task.fork_after - 1),
                   "tool_call_id": f"call_{task.fork_after - 1}", "tool_name": task.fork_phase.name}
    history = History(messages=messages, task=task.id, tools=task.tools(),
                      fork=Fork(len(messages) - 1, fork_action, task.fork_info()["pending_result"]))
    checked = History.from_json(history.to_json(), origin=task.id)
    assert checked == history
    assert env.execute(fork_action)["output"] == task.fork_info()["pending_result"]
