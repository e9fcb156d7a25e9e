"""Fuzzing history files and the importers' inputs. 0 tracebacks: every input either loads or is
refused with a `SuiteError` whose message names the file (and the field where there is one).

Inputs: arbitrary bytes (non-UTF-8, broken and deeply nested JSON), arbitrary JSON values, and
mutations of real inputs (a shipped history file, one file of each importer format, a study
record) where one to three nodes are replaced by arbitrary JSON or deleted.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.paths import histories_root, study_root
from compaction_bench.histories.format.history import (
    History,
    HistoryError,
    load_history,
    save_history,
)
from compaction_bench.histories.format.importers import import_history

SHIPPED_HISTORY = histories_root() / "fix-median" / "clean.json"
STUDY_RECORD = sorted((study_root() / "records").glob("*__rep-*.json"))[0]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["role", "content", "tool_calls", "function", "arguments", "name", "id",
                         "type", "reasoning", "extra", "messages", "history", "trajectory",
                         "info", "fork", "message_index", "action", "command", "x"])
        | st.text(max_size=6), inner, max_size=4),
    max_leaves=16)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a JSON tree (the root is the empty path)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


@st.composite
def mutated(draw: st.DrawFn, seed: Any) -> Any:
    """`seed` with one to three nodes replaced by arbitrary JSON or deleted."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(paths(value))))
        replacement = draw(JSON)
        if not path:
            value = replacement
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, list) and draw(st.booleans()):
            parent.insert(path[-1], replacement)
        else:
            parent[path[-1]] = replacement
        if not isinstance(value, dict | list):
            break
    return value


def check_refusal(exc: SuiteError, path: Path) -> None:
    assert str(path) in str(exc), f"the message does not name the file: {exc}"
    assert "\n" not in str(exc).strip() or str(exc).startswith(str(path))


def load_or_refuse(path: Path) -> History | None:
    try:
        return load_history(path)
    except HistoryError as exc:
        check_refusal(exc, path)
        return None


def import_or_refuse(path: Path, **kwargs: Any) -> History | None:
    try:
        return import_history(path, **kwargs)
    except HistoryError as exc:
        check_refusal(exc, path)
        return None


NESTED = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = json.dumps({"history_format": "compaction-bench-history", "history_version": 1,
                          "messages": [], "extra": {"x": [[[[[[[[]]]]]]]]}})


@given(st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode())))
@example(b"\xff\xfe{}")
@example(NESTED)
@example(b'{"history_format": "compaction-bench-history", "history_version": 1, "messages": ['
         + b"[" * 3000 + b"]" * 3000 + b"]}")
def test_any_bytes_load_or_are_refused_naming_the_file(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "history.json"
    path.write_bytes(raw)
    load_or_refuse(path)
    import_or_refuse(path)


SHIPPED = json.loads(SHIPPED_HISTORY.read_text(encoding="utf-8"))


@given(mutated(SHIPPED))
@example({**SHIPPED, "messages": [*SHIPPED["messages"][:-1],
                                  {**SHIPPED["messages"][-1], "tool_calls": 1}]})
def test_a_mutated_history_loads_or_is_refused_and_what_loads_saves(tmp_path: Path,
                                                                     data: Any) -> None:
    path = tmp_path / "clean.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    history = load_or_refuse(path)
    if history is None:
        return
    copy_path = tmp_path / "saved.json"
    save_history(history, copy_path)  # what loads, saves: the writer accepts what the reader did
    again = load_history(copy_path)
    assert again.content_hash() == load_history(copy_path).content_hash()


# --- the importers' inputs -------------------------------------------------------------------

def _call(call_id: str, command: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


MSWEA_V2 = {"trajectory_format": "mini-swe-agent-1.1", "info": {"config": {"model": {
    "model_name": "m"}}}, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
        {"role": "assistant", "content": None, "reasoning_content": "look",
         "tool_calls": [_call("a", "ls")]},
        {"role": "tool", "tool_call_id": "a", "content": "x.py"},
        {"role": "assistant", "content": None, "reasoning": "test",
         "tool_calls": [_call("b", "pytest")]},
        {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}]}
MSWEA_V1 = {"trajectory_format": "mini-swe-agent-1", "messages": [
    {"role": "system", "content": "sys"}, {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "THOUGHT: look\n\n```bash\nls\n```"},
    {"role": "user", "content": "<output>x.py</output>"},
    {"role": "assistant", "content": "THOUGHT: test\n\n```bash\npytest\n```"}]}
SWE_AGENT = {"info": {"instance_id": "i-1"}, "history": [
    {"role": "system", "content": "sys", "agent": "main"},
    {"role": "user", "content": "Fix it.", "message_type": "observation"},
    {"role": "assistant", "content": "look", "thought": "look", "action": "ls",
     "tool_calls": [_call("c", "ls")], "thinking_blocks": [{"thinking": "hm"}]},
    {"role": "tool", "content": "x.py", "tool_call_ids": ["c"]}]}
SWE_STEPS = {"trajectory": [
    {"thought": "look", "action": "ls", "observation": "x.py", "response": "",
     "query": [{"role": "system", "content": "sys"}]},
    {"thought": "test", "action": "pytest", "observation": None}]}
OPENAI = {"model": "m", "messages": [
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "", "tool_calls": [_call("d", "ls")]},
    {"role": "tool", "tool_call_id": "d", "content": "a.py"}],  # the default fork needs a result
    "tools": [{"type": "function", "function": {"name": "bash"}}]}
SEEDS = {"mswea-v2": MSWEA_V2, "mswea-v1": MSWEA_V1, "swe-agent": SWE_AGENT,
         "swe-agent-steps": SWE_STEPS, "openai": OPENAI}


@pytest.mark.parametrize("name", SEEDS)
def test_the_seed_inputs_import(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(SEEDS[name]))
    history = import_history(path)
    assert history.fork is not None and history.messages


@pytest.mark.parametrize("name", SEEDS)
@settings(max_examples=settings.default.max_examples)
@given(data=st.data())
def test_a_mutated_import_loads_or_is_refused_naming_the_file(tmp_path: Path, name: str,
                                                              data: st.DataObject) -> None:
    value = data.draw(mutated(SEEDS[name]))
    fork = data.draw(st.none() | st.integers(-2, 8))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(value))
    history = import_or_refuse(path, fork=fork)
    if history is not None:
        save_history(history, tmp_path / "out.json")


TOOL_CALLS_1 = {**MSWEA_V2, "messages": [*MSWEA_V2["messages"][:2],
                                         {**MSWEA_V2["messages"][2], "tool_calls": 1}]}


@pytest.mark.parametrize("bad", [
    TOOL_CALLS_1,
    {**OPENAI, "messages": [{"role": "assistant", "content": "", "tool_calls": 1}]},
    {**SWE_AGENT, "history": [{"role": "tool", "content": "x", "tool_call_ids": 1}]},
    {**SWE_AGENT, "history": [{"role": "user", "content": "x", "tool_call_ids": [1],
                               "extra": 1}]},
    {**MSWEA_V2, "messages": [{"role": "user", "content": "x",
                               "extra": {"source_fields": 1}, "weird": 2}]},
], ids=["mswea-tool_calls-1", "openai-tool_calls-1", "swe-tool_call_ids-1", "swe-extra-1",
        "source_fields-1"])
def test_the_shapes_that_raised_type_errors_are_refused(tmp_path: Path,
                                                        bad: dict[str, Any]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(HistoryError, match=str(path)):
        import_history(path)


STUDY = json.loads(STUDY_RECORD.read_text(encoding="utf-8"))


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(mutated(STUDY))
@example({**STUDY, "branches": {**STUDY["branches"], "clean": {
    **STUDY["branches"]["clean"], "turns": [{**STUDY["branches"]["clean"]["turns"][0],
                                            "response": 1}]}}})
@example({**STUDY, "model": 1})
def test_a_mutated_study_record_loads_or_is_refused(tmp_path: Path, data: Any) -> None:
    path = tmp_path / "record__rep-01.json"
    path.write_text(json.dumps(data))
    import_or_refuse(path)
    import_or_refuse(path, arm="external")
