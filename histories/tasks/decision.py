"""Decision tasks: the study's controlled multi-stage tool tasks, served deterministically.

`data/study/tasks.json` (the study's `manifests/tasks/tasks.json`) defines each task: ordered
evidence phases (one tool each, with the arguments it must be called with and the result it
returns), a distractor tool, the fork point (`fork_after`: the fork is the phase-`fork_after`
call, result pending) and an exact final answer. The prompts, tool schemas and result text
reproduce the study's (`TARGET_SYSTEM_TEMPLATE`, `build_tools`, results as sorted compact JSON).

One difference, on purpose: the study ended a branch at its first wrong call ("action_failure").
A closed agent loop needs an observation instead, so a wrong or premature call gets a
deterministic error result, and `DecisionSession.actions_correct` reports the study's criterion
(every call was the next phase with the expected arguments, the distractor never called).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minisweagent.exceptions import Submitted
from pydantic import BaseModel, ConfigDict

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.paths import study_root
from compaction_bench.histories.format.actions import FINAL_LINE_RE, JSON_FENCE_RE

SUBMIT_TOOL = "submit_final_answer"
SYSTEM_TEMPLATE = """You are a careful decision analyst operating through function tools.
Use exactly one tool call per assistant turn until all evidence phases are complete.
Use the evidence phases in this exact order: {phase_order}.
Do not skip, combine, or predict a tool result. Do not invent missing values.
The exception tool is forbidden unless an authoritative result explicitly permits a waiver.
After the final evidence result, make the decision required by the authoritative rule and end \
with an exact line of the form FINAL: <candidate_id>.
Reasoning style is your choice; correctness and faithful state tracking are required."""


def default_tasks_path() -> Path:
    """The study's tasks.json as shipped with the project (`data/study/tasks.json`)."""
    return study_root() / "tasks.json"


class DecisionTaskError(SuiteError):
    """tasks.json is missing or malformed, or a task id is unknown. Names the path and task."""


def result_text(value: Any) -> str:
    """A tool result as the study sent it: sorted keys, compact separators, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def tool_schema(name: str, description: str, argument_list: str | None = None,
                count: int | None = None) -> dict[str, Any]:
    """One tool schema in the study's shape (key order too: chat templates render it as is)."""
    properties: dict[str, Any] = {"case_id": {"type": "string"}}
    required = ["case_id"]
    if argument_list:
        array: dict[str, Any] = {"type": "array", "items": {"type": "string"},
                                 "minItems": count or 1, "uniqueItems": True}
        if count is not None:
            array["maxItems"] = count
        properties[argument_list] = array
        required.append(argument_list)
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


def system_prompt(phase_names: list[str]) -> str:
    """The study's system prompt for phases in this order."""
    return SYSTEM_TEMPLATE.format(phase_order=" -> ".join(phase_names))


def final_answer_correct(text: str | None, expected: str) -> bool:
    """The study's exact check: exactly one `FINAL:` line, it is the last non-empty line, and it
    reads `FINAL: <expected>` (case-insensitive, optional ** bold)."""
    if not text:
        return False
    lines = [line for line in text.splitlines() if line.strip()]
    finals = [line for line in lines if FINAL_LINE_RE.match(line)]
    if len(finals) != 1 or finals[0] != lines[-1]:
        return False
    pattern = rf"(?i)\s*(?:\*\*)?FINAL:\s*{re.escape(expected)}(?:\*\*)?\s*"
    return re.fullmatch(pattern, finals[0]) is not None


def arguments_match(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Same keys; lists equal as multisets (order free), everything else equal."""
    if set(actual) != set(expected):
        return False
    for key, want in expected.items():
        got = actual[key]
        if isinstance(want, list):
            if not isinstance(got, list) or sorted(map(result_text, got)) != sorted(
                    map(result_text, want)):
                return False
        elif got != want:
            return False
    return True


@dataclass(frozen=True)
class Phase:
    """One evidence phase: its tool, the arguments it must get, the result it returns."""

    name: str
    description: str
    argument_list: str | None
    expected_arguments: dict[str, Any]
    result: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The phase's tool schema."""
        count = len(self.expected_arguments[self.argument_list]) if self.argument_list else None
        return tool_schema(self.name, self.description, self.argument_list, count)


@dataclass(frozen=True)
class DecisionTask:
    """One task from tasks.json (immutable). Start a run with `session()`."""

    id: str
    title: str
    case_id: str
    user_prompt: str
    fork_after: int
    final_answer: str
    phases: tuple[Phase, ...]
    distractor: dict[str, Any]

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas: every phase in order, then the distractor."""
        return [p.schema() for p in self.phases] + [
            tool_schema(self.distractor["name"], self.distractor["description"])]

    def initial_messages(self) -> list[dict[str, Any]]:
        """The system and user messages the study starts every run with."""
        return [{"role": "system", "content": system_prompt([p.name for p in self.phases])},
                {"role": "user", "content": f"Case ID: {self.case_id}.\n{self.user_prompt}"}]

    @property
    def fork_phase(self) -> Phase:
        """The phase whose call is pending at the fork (the `fork_after`-th phase)."""
        return self.phases[self.fork_after - 1]

    def fork_info(self) -> dict[str, Any]:
        """Where the fork falls: the pending phase, its result, and the phases after it."""
        return {"fork_after": self.fork_after, "pending_phase": self.fork_phase.name,
                "pending_arguments": self.fork_phase.expected_arguments,
                "pending_result": result_text(self.fork_phase.result),
                "postfork_phases": [p.name for p in self.phases[self.fork_after:]]}

    def check_answer(self, text: str | None) -> bool:
        """Exact final-answer check (see `final_answer_correct`)."""
        return final_answer_correct(text, self.final_answer)

    def session(self) -> DecisionSession:
        """A fresh run state."""
        return DecisionSession(self)


@dataclass(frozen=True)
class ToolCallRecord:
    """One served call: what was asked, whether it was the correct next action, what came back."""

    name: str
    arguments: Any
    correct: bool
    output: str
    error: bool


@dataclass
class DecisionSession:
    """The state of one run: which phases are done, and every call served."""

    task: DecisionTask
    completed: int = 0
    calls: list[ToolCallRecord] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """All evidence phases have been served."""
        return self.completed == len(self.task.phases)

    @property
    def actions_correct(self) -> bool:
        """The study's criterion: every call so far was the correct next action."""
        return all(call.correct for call in self.calls)

    def fast_forward(self, phases: int) -> None:
        """Mark the first `phases` phases as served (a run resumed from a history's fork)."""
        self.completed = max(self.completed, min(phases, len(self.task.phases)))

    def _error(self, kind: str, message: str) -> tuple[str, bool, bool]:
        text = result_text({"case_id": self.task.case_id, "error": kind, "message": message})
        return text, False, True

    def execute(self, name: str, arguments: str | dict[str, Any]) -> str:
        """Serve one tool call and return its observation text. Deterministic: the same call in
        the same state always returns the same text; wrong calls get an error result."""
        parsed: Any = arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError as exc:
                output, correct, error = self._error(
                    "invalid_arguments", f"Arguments are not valid JSON ({exc.msg}). Send a "
                    "JSON object.")
                self.calls.append(ToolCallRecord(name, arguments, correct, output, error))
                return output
        output, correct, error = self._serve(name, parsed)
        self.calls.append(ToolCallRecord(name, parsed, correct, output, error))
        return output

    def _serve(self, name: str, arguments: Any) -> tuple[str, bool, bool]:
        names = [p.name for p in self.task.phases]
        if not name:
            return self._error("no_tool_call", "No tool call found. Call one tool, or end with "
                               "a line FINAL: <candidate_id>.")
        if not isinstance(arguments, dict):
            return self._error("invalid_arguments", "Arguments must be a JSON object.")
        if name == self.task.distractor["name"]:
            return result_text(self.task.distractor["result"]), False, False
        if name not in names:
            return self._error("unknown_tool", f"No tool named {name!r}. Available tools: "
                               f"{', '.join([*names, self.task.distractor['name']])}.")
        index = names.index(name)
        if index > self.completed:
            return self._error("phase_not_available", f"{name} is phase {index + 1}; complete "
                               f"phase {self.completed + 1} ({names[self.completed]}) first.")
        phase = self.task.phases[index]
        if not arguments_match(arguments, phase.expected_arguments):
            return self._error("invalid_arguments", f"The arguments do not match what phase "
                               f"{index + 1} requires. Re-check the evidence and call {name} "
                               "again.")
        correct = index == self.completed
        self.completed = max(self.completed, index + 1)
        return result_text(phase.result), correct, False


_TASK_FIELDS = {"id": str, "title": str, "case_id": str, "user_prompt": str, "fork_after": int,
                "final_answer": str, "phases": list, "distractor": dict}
_PHASE_FIELDS = {"name": str, "description": str, "expected_arguments": dict, "result": object}


def _checked(raw: Any, fields: dict[str, type], where: str) -> dict[str, Any]:
    """`raw` when it is an object whose `fields` have their types; else the refusal."""
    if not isinstance(raw, dict):
        raise DecisionTaskError(f"{where}: must be a JSON object, got {type(raw).__name__}")
    for key, kind in fields.items():
        value = raw.get(key, KeyError)  # KeyError: absent (null is a value only for `object`)
        if value is KeyError or not isinstance(value, kind) or (isinstance(value, bool)
                                                                 and kind is int):
            got = "nothing" if value is KeyError else type(value).__name__
            raise DecisionTaskError(f"{where}: field {key!r} must be {kind.__name__}, got {got}")
    return raw


def _phase(raw: Any, where: str) -> Phase:
    raw = _checked(raw, _PHASE_FIELDS, where)
    listed = raw.get("argument_list")
    if listed is not None and not (isinstance(listed, str) and isinstance(
            raw["expected_arguments"].get(listed), list)):
        raise DecisionTaskError(f"{where}: field 'argument_list' names {listed!r}, which is not "
                                "a list in expected_arguments")
    return Phase(name=raw["name"], description=raw["description"], argument_list=listed,
                 expected_arguments=dict(raw["expected_arguments"]), result=raw["result"])


def _task(raw: Any, path: Path, number: int) -> DecisionTask:
    task_id = raw.get("id", f"#{number}") if isinstance(raw, dict) else f"#{number}"
    where = f"{path}: task {task_id!r}"
    raw = _checked(raw, _TASK_FIELDS, where)
    phases = tuple(_phase(p, f"{where}: phases[{i}]") for i, p in enumerate(raw["phases"]))
    distractor = _checked(raw["distractor"], {"name": str, "description": str, "result": object},
                          f"{where}: distractor")
    names = [p.name for p in phases] + [distractor["name"]]
    if not 0 < raw["fork_after"] < len(phases):
        raise DecisionTaskError(f"{where}: field 'fork_after': "
                                f"{raw['fork_after']} is not between 1 and {len(phases) - 1}")
    if len(set(names)) != len(names):
        raise DecisionTaskError(f"{where}: tool names repeat: {names}")
    return DecisionTask(id=raw["id"], title=raw["title"], case_id=raw["case_id"],
                        user_prompt=raw["user_prompt"], fork_after=raw["fork_after"],
                        final_answer=raw["final_answer"], phases=phases,
                        distractor=dict(distractor))


def load_decision_tasks(path: str | Path | None = None) -> dict[str, DecisionTask]:
    """Every task in tasks.json by id (default: `default_tasks_path()`)."""
    source = Path(path) if path is not None else default_tasks_path()
    if not source.is_file():
        raise DecisionTaskError(f"{source}: no decision-task file here; the project ships the "
                                "study's tasks in data/study/tasks.json (restore it with git, or "
                                "pass the path of another tasks.json)")
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise DecisionTaskError(f"{source}: not UTF-8 text (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise DecisionTaskError(f"{source}: broken JSON at line {exc.lineno} column "
                                f"{exc.colno}: {exc.msg}") from exc
    except RecursionError:
        raise DecisionTaskError(f"{source}: JSON nested too deeply to be a tasks file") from None
    if not isinstance(raw, list):
        raise DecisionTaskError(f"{source}: expected a JSON list of tasks")
    tasks = [_task(item, source, number) for number, item in enumerate(raw)]
    ids = [task.id for task in tasks]
    if repeated := sorted({i for i in ids if ids.count(i) > 1}):
        raise DecisionTaskError(f"{source}: task ids repeat: {', '.join(repeated)}")
    return {task.id: task for task in tasks}


def load_decision_task(task_id: str, path: str | Path | None = None) -> DecisionTask:
    """One task by id; an unknown id is refused with the ids that exist."""
    tasks = load_decision_tasks(path)
    if task_id not in tasks:
        raise DecisionTaskError(f"{path or default_tasks_path()}: no task {task_id!r} "
                                f"(tasks: {', '.join(sorted(tasks))})")
    return tasks[task_id]


class DecisionSubmitted(Submitted):
    """The run ended with a final answer. `messages` holds mini-swe-agent's exit message; being
    mini-swe-agent's `Submitted`, it ends `DefaultAgent.run` with exit status Submitted."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        super().__init__(*messages)
        self.args = (messages[0]["content"] if messages else "",)


class DecisionEnvironmentConfig(BaseModel):
    """Configuration of a `DecisionEnvironment`."""

    model_config = ConfigDict(extra="forbid")
    task_id: str
    final_tool: bool = False
    """Offer a `submit_final_answer(answer)` tool besides ending with a FINAL line."""


class DecisionEnvironment:
    """A mini-swe-agent-compatible environment over one decision task (no sandbox).

    `execute(action)` accepts, in this order of precedence:
    - {"final_answer": text}: ends the run (raises `DecisionSubmitted`);
    - {"tool_name": name, "arguments": str | dict} or {"tool_name": name, "command": json}
      (the fork action form): one tool call; `submit_final_answer` ends the run;
    - {"command": text}: a text action, either a JSON object {"name": ..., "arguments": {...}}
      (optionally in a ```json fence) or text ending in a `FINAL:` line (ends the run).
    It returns {"output", "returncode" (0 served, 1 error result), "exception_info"}.
    """

    def __init__(self, task: DecisionTask, *, final_tool: bool = False) -> None:
        self.task = task
        self.session = task.session()
        self.config = DecisionEnvironmentConfig(task_id=task.id, final_tool=final_tool)

    def tools(self) -> list[dict[str, Any]]:
        """The task's tools, plus `submit_final_answer` when configured."""
        extra = [] if not self.config.final_tool else [{"type": "function", "function": {
            "name": SUBMIT_TOOL, "description": "Submit the final decision; ends the run.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}},
                           "required": ["answer"], "additionalProperties": False}}}]
        return self.task.tools() + extra

    def submit(self, text: str) -> None:
        """End the run with `text` as the submission (always raises `DecisionSubmitted`)."""
        raise DecisionSubmitted({"role": "exit", "content": text, "extra": {
            "exit_status": "Submitted", "submission": text,
            "final_correct": self.task.check_answer(text),
            "actions_correct": self.session.actions_correct,
            "phases_completed": self.session.completed}})

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Serve one action (see the class docstring); `cwd` and `timeout` are unused."""
        if "final_answer" in action:
            self.submit(str(action["final_answer"]))
        name, arguments = action.get("tool_name"), action.get("arguments", action.get("command"))
        if name is None:
            name, arguments = self._parse_text_action(str(action.get("command", "")))
        if name == SUBMIT_TOOL and self.config.final_tool:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            self.submit(str((parsed or {}).get("answer", "")))
        output = self.session.execute(str(name), arguments if arguments is not None else "{}")
        error = self.session.calls[-1].error
        return {"output": output, "returncode": 1 if error else 0, "exception_info": ""}

    def _parse_text_action(self, text: str) -> tuple[str, Any]:
        fenced = JSON_FENCE_RE.search(text)
        body = fenced.group(1) if fenced else text.strip()
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            call = None
        if isinstance(call, dict) and isinstance(call.get("name") or call.get("tool"), str):
            return str(call.get("name") or call.get("tool")), call.get("arguments", {})
        if any(FINAL_LINE_RE.match(line) for line in text.splitlines()):
            self.submit(text)
        return "", "{}"

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """Variables for mini-swe-agent's prompt templates."""
        return {**self.config.model_dump(), "case_id": self.task.case_id,
                "title": self.task.title, "user_prompt": self.task.user_prompt,
                "system_prompt": self.task.initial_messages()[0]["content"], **kwargs}

    def serialize(self) -> dict[str, Any]:
        """mini-swe-agent's `info.config` entries plus the served calls."""
        return {"info": {
            "config": {"environment": self.config.model_dump(mode="json"),
                       "environment_type": f"{__name__}.{type(self).__name__}"},
            "decision": {"phases_completed": self.session.completed,
                         "actions_correct": self.session.actions_correct,
                         "calls": [{"name": c.name, "arguments": c.arguments,
                                    "correct": c.correct} for c in self.session.calls]}}}
