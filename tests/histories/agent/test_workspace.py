"""Per-run workspaces: real copies, real processes."""

from __future__ import annotations

import os
import time

import pytest
from minisweagent.exceptions import Submitted

from compaction_bench.histories.agent.workspace import Workspace
from compaction_bench.histories.tasks.task import TaskError, known_tasks, load_task, runnable_tasks


@pytest.mark.e2e
def test_shipped_tasks_load_and_repo_tasks_fail_before_a_fix() -> None:
    assert {"fix-median", "fix-slugify", "sphinx-doc__sphinx-10466"} <= set(known_tasks())
    assert set(runnable_tasks()) == {"fix-median", "fix-slugify"}
    for task_id in runnable_tasks():
        with Workspace(load_task(task_id)) as ws:
            assert not ws.validate().passed  # the bug is real: the shipped tests fail


def test_unknown_task_lists_known_ones() -> None:
    with pytest.raises(TaskError, match="unknown task 'nope'; known tasks: fix-median"):
        load_task("nope")


@pytest.mark.e2e
def test_swebench_task_says_what_it_needs() -> None:
    with pytest.raises(TaskError, match="docker"):
        load_task("sphinx-doc__sphinx-10466").check_runnable()


@pytest.mark.e2e
def test_commands_run_in_a_private_copy_and_the_fix_validates() -> None:
    task = load_task("fix-median")
    original = (task.workspace / "stats_utils.py").read_text()
    with Workspace(task) as ws:
        assert ws.env is not None
        fix = ("sed -i 's/    return ordered\\[middle\\]/    if len(ordered) % 2 == 0:\\n"
               "        return (ordered[middle - 1] + ordered[middle]) \\/ 2\\n"
               "    return ordered[middle]/' stats_utils.py")
        assert ws.env.execute({"command": fix})["returncode"] == 0
        assert ws.validate().passed
        assert "ordered[middle - 1]" in ws.patch()
        copy = ws.path
    assert (task.workspace / "stats_utils.py").read_text() == original
    assert not copy.exists()


@pytest.mark.e2e
def test_timeout_output_cap_and_no_leaked_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPBENCH_TEST_SECRET", "hunter2")
    with Workspace(load_task("fix-slugify")) as ws:
        assert ws.env is not None
        start = time.monotonic()
        slow = ws.env.execute({"command": "sleep 30 & sleep 30; echo never"}, timeout=1)
        assert time.monotonic() - start < 10
        assert slow["returncode"] == -1 and "timed out after 1 s" in slow["exception_info"]
        big = ws.env.execute({"command": "python3 -c 'print(\"x\" * 10000)'"})
        assert "[output truncated: 4000 characters of 10001 bytes shown]" in big["output"]
        env = ws.env.execute({"command": "env"})["output"]
        assert "hunter2" not in env and f"HOME={ws.path}" in env
        assert os.environ["COMPBENCH_TEST_SECRET"] == "hunter2"  # the caller's env is untouched
        with pytest.raises(Submitted):
            ws.env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
