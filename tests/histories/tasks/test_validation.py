"""Validation the agent cannot forge: the task's own tests put back, shadowing modules refused.
The unit tests read real folders; the e2e tests run the task's validation in the real box."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.histories.agent.workspace import Workspace
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.histories.tasks.validation import shadowing, task_test_files, validation_copy

FAKE_UNITTEST = "import sys\nsys.exit(0)\n"
FIX = ("    if len(ordered) % 2 == 0:\n"
       "        return (ordered[middle - 1] + ordered[middle]) / 2\n")


def test_the_task_test_files_are_found_in_the_pristine_tree() -> None:
    assert task_test_files(load_task("fix-median").workspace) == [Path("test_stats_utils.py")]


def test_shadowing_names_each_module_and_what_it_shadows(tmp_path: Path) -> None:
    pristine = load_task("fix-median").workspace
    (tmp_path / "unittest.py").write_text(FAKE_UNITTEST)
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "sitecustomize.py").write_text("")
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "helpers.py").write_text("")  # a new module of its own name is fine
    found = shadowing(tmp_path, pristine)
    assert any(f.startswith("unittest.py: shadows the standard-library module unittest")
               for f in found)
    assert any(f.startswith("json: shadows") for f in found)
    assert any("sitecustomize" in f for f in found) and any("conftest" in f for f in found)
    assert not any("helpers" in f for f in found)
    assert shadowing(pristine, pristine) == []


def test_the_copy_restores_tests_even_through_a_link(tmp_path: Path) -> None:
    pristine = load_task("fix-median").workspace
    work, dest, outside = tmp_path / "work", tmp_path / "dest", tmp_path / "outside.py"
    work.mkdir()
    outside.write_text("untouched")
    (work / "stats_utils.py").write_text("x = 1\n")
    (work / "test_stats_utils.py").symlink_to(outside)  # the agent's "test" points out
    validation_copy(work, pristine, dest)
    restored = dest / "test_stats_utils.py"
    assert not restored.is_symlink()
    assert restored.read_bytes() == (pristine / "test_stats_utils.py").read_bytes()
    assert outside.read_text() == "untouched" and (dest / "stats_utils.py").read_text() == "x = 1\n"


@pytest.mark.e2e
def test_a_shadowed_unittest_does_not_pass_an_unfixed_bug() -> None:
    with Workspace(load_task("fix-median")) as ws:
        (ws.path / "unittest.py").write_text(FAKE_UNITTEST)
        got = ws.validate()
        assert not got.passed and "unittest.py: shadows the standard-library module" in got.output


@pytest.mark.e2e
def test_edited_tests_are_put_back_and_the_agents_tree_is_left_as_it_was() -> None:
    with Workspace(load_task("fix-median")) as ws:
        tests = ws.path / "test_stats_utils.py"
        tests.write_text("import unittest\nclass T(unittest.TestCase):\n"
                         "    def test_ok(self):\n        pass\n")
        forged = tests.read_text()
        assert not ws.validate().passed  # the task's own tests ran: the bug is still there
        assert tests.read_text() == forged  # validation ran in a copy
        module = ws.path / "stats_utils.py"
        module.write_text(module.read_text().replace("    return ordered[middle]\n",
                                                     FIX + "    return ordered[middle]\n"))
        assert ws.validate().passed  # a real fix passes the real tests
