"""Fuzzing task files: `task.toml` (arbitrary bytes and line-level mutations of a shipped one,
under a temporary tasks root), task ids, and the decision tasks' `tasks.json`. 0 tracebacks:
every input loads or is refused with a `SuiteError` naming the file (or the unknown id)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.paths import study_root, tasks_root
from compaction_bench.histories.tasks.decision import DecisionTaskError, load_decision_tasks
from compaction_bench.histories.tasks.task import Task, TaskError, load_task

SHIPPED = (tasks_root() / "fix-median" / "task.toml").read_text(encoding="utf-8")
SHIPPED_DECISIONS = json.loads((study_root() / "tasks.json").read_text(encoding="utf-8"))
LITERALS = ['"x"', "-1", "0", "1e309", "inf", "[]", "{}", "true", "1979-05-27", '""',
            '"""\nmulti\n"""', "99999999999999999999999", '"repo"', '"decision"', '"other"']
EXTRA_LINES = ["[x]", "instance_id = 1", "unknown = 2", "kind = 'swebench'", "= 1", "\x00"]


@st.composite
def mutated_toml(draw: st.DrawFn, text: str) -> bytes:
    """`text` with one to four lines replaced in value, deleted, duplicated or inserted, and
    sometimes a few arbitrary bytes spliced in."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(lines) - 1)))
        action = draw(st.sampled_from(["value", "delete", "duplicate", "insert"]))
        if action == "value" and "=" in lines[at]:
            key = lines[at].split("=", 1)[0]
            lines[at] = f"{key}= {draw(st.sampled_from(LITERALS) | st.text(max_size=8))}"
        elif action == "delete" and lines:
            del lines[at]
        elif action == "duplicate" and lines:
            lines.insert(at, lines[at])
        else:
            lines.insert(at, draw(st.sampled_from(EXTRA_LINES) | st.text(max_size=20)))
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        return data
    cut = draw(st.integers(0, len(data)))
    return data[:cut] + draw(st.binary(max_size=4)) + data[cut:]


@pytest.fixture()
def data_root(tmp_path: Path) -> Iterator[Path]:
    """A temporary data root (COMPBENCH_DATA) with one task folder, `t`, and no study data."""
    old = os.environ.get("COMPBENCH_DATA")
    os.environ["COMPBENCH_DATA"] = str(tmp_path)
    (tmp_path / "tasks" / "t" / "workspace").mkdir(parents=True)
    yield tmp_path
    if old is None:
        os.environ.pop("COMPBENCH_DATA", None)
    else:
        os.environ["COMPBENCH_DATA"] = old


def load_or_refuse(task_id: str, named: str) -> Task | None:
    try:
        task = load_task(task_id)
    except TaskError as exc:
        assert named in str(exc), f"the message does not name {named!r}: {exc}"
        event("refused")
        return None
    event("loaded")
    return task


@given(st.one_of(st.binary(max_size=300), mutated_toml(SHIPPED.replace('"fix-median"', '"t"'))))
@example(b"\xff\xfeid = 't'")
@example(SHIPPED.replace('"fix-median"', '"t"').replace("step_limit = 8", "step_limit = 0")
         .encode())
def test_any_task_file_loads_or_is_refused_naming_the_file(data_root: Path, raw: bytes) -> None:
    path = data_root / "tasks" / "t" / "task.toml"
    path.write_bytes(raw)
    task = load_or_refuse("t", str(path))
    if task is not None:
        assert task.id == "t" and task.spec.step_limit > 0
        task.check_runnable() if task.spec.kind == "repo" else None


@given(st.text(max_size=30))
@example("../t")
@example("t/../t")
@example("")
@example("a\x00b")
def test_any_task_id_is_a_task_or_refused_by_name(data_root: Path, task_id: str) -> None:
    (data_root / "tasks" / "t" / "task.toml").write_text(SHIPPED.replace('"fix-median"', '"t"'))
    try:
        load_task(task_id)
    except TaskError as exc:
        assert "unknown task" in str(exc) or "must match" in str(exc) or "task.toml" in str(exc)


@st.composite
def mutated_decisions(draw: st.DrawFn) -> Any:
    """The shipped tasks.json with one field of one task replaced or deleted."""
    tasks = json.loads(json.dumps(SHIPPED_DECISIONS))
    task = draw(st.sampled_from(tasks))
    key = draw(st.sampled_from(sorted(task)))
    if draw(st.booleans()):
        del task[key]
    else:
        task[key] = draw(st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=6),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                st.text(max_size=5), inner, max_size=3), max_leaves=8))
    return tasks


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(st.one_of(mutated_decisions(), st.binary(max_size=100)))
@example(b"[" * 100_000)
@example(SHIPPED_DECISIONS[:1] * 2)
def test_a_decision_tasks_file_loads_or_is_refused_naming_it(tmp_path: Path, data: Any) -> None:
    path = tmp_path / "tasks.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    try:
        load_decision_tasks(path)
    except DecisionTaskError as exc:
        assert str(path) in str(exc), f"the message does not name the file: {exc}"
        assert isinstance(exc, SuiteError)
