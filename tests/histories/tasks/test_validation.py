"""Validation the agent cannot forge: the task's own tests put back, shadowing modules refused.
The unit tests read real folders; the e2e tests run the task's validation in the real box."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.histories.agent.workspace import Workspace
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.histories.tasks.validation import (
    Canary,
    expected_tests,
    shadowing,
    task_test_files,
    unittest_verdict,
    validation_copy,
)

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


def test_linked_sourceless_and_test_named_modules_are_shadowing_too(tmp_path: Path) -> None:
    pristine = load_task("fix-median").workspace
    (tmp_path / "fakeut").mkdir()
    (tmp_path / "fakeut" / "__init__.py").write_text(FAKE_UNITTEST)
    (tmp_path / "unittest").symlink_to("fakeut")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.pyc").write_bytes(b"")
    (tmp_path / "test_stats_utils").mkdir()
    (tmp_path / "test_stats_utils" / "__init__.py").write_text("")
    (tmp_path / "email").mkdir()  # a folder without __init__: a namespace portion, harmless
    found = shadowing(tmp_path, pristine)
    assert "unittest: shadows the standard-library module unittest" in found
    assert "json: shadows the standard-library module json" in found
    assert ("test_stats_utils: would be imported instead of the task's test module "
            "test_stats_utils") in found
    assert not any(f.startswith(("email", "fakeut")) for f in found), found


def test_the_unittest_verdict_reads_unittests_report_not_the_exit_code() -> None:
    canary = Canary.draw()
    token = canary.module.removeprefix("test_zz_")
    fails = "".join(f"FAIL: test_{name}_{token} ({canary.module}.Check{token}.test_{name}_{token})"
                    "\n" for name in ("equal", "true", "in", "raises", "almost"))
    line = "-" * 70
    good = f"{fails}{line}\nRan 10 tests in 0.002s\n\nFAILED (failures=5)\n"
    assert unittest_verdict(good, 1, 5, canary) == (True, "")
    # exit 0 with the same report, or with nothing at all
    assert unittest_verdict(good, 0, 5, canary)[0]
    assert unittest_verdict("", 0, 5, canary) == (
        False, "unittest reported no run (no 'Ran N tests' line): the tests did not run")
    # the task's own test failed beside the canary
    bad = good.replace("Ran 10", "Ran 10").replace(
        "FAIL: test_equal", "FAIL: test_even (test_stats_utils.MedianTest.test_even)\n"
        "FAIL: test_equal").replace("failures=5", "failures=6")
    assert unittest_verdict(bad, 0, 5, canary) == (
        False, "failed: test_even")
    # a disabled assertion: the canary passed
    passed = f"{line}\nRan 10 tests in 0.002s\n\nOK\n"
    assert "5 of the canary's 5 false assertions passed" in unittest_verdict(
        passed, 0, 5, canary)[1]
    # fewer tests than the task defines
    assert "ran 6 tests, fewer than the 10" in unittest_verdict(
        good.replace("Ran 10", "Ran 6"), 1, 5, canary)[1]
    assert expected_tests(load_task("fix-median").workspace) == 5
    # each draw is its own: names and values change
    assert Canary.draw().source != canary.source


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


# --- the six forgeries of issue 34, each on the unfixed bug: validation must fail ---------------

FAKE_PACKAGE = "import sys\nsys.exit(0)\n"
STOP_ON_IMPORT = "import os\nos._exit(0)\n"
FORCE_EXIT = "import atexit, os\natexit.register(lambda: os._exit(0))\n"
NO_ASSERT = ("import unittest\n"
             "unittest.TestCase.assertEqual = lambda self, *a, **k: None\n"
             "unittest.TestCase.assertRaises = lambda self, *a, **k: __import__("
             "'contextlib').nullcontext()\n")


def _prepend(ws: Workspace, text: str) -> None:
    module = ws.path / "stats_utils.py"
    module.write_text(text + module.read_text())


@pytest.mark.e2e
@pytest.mark.parametrize("attack", ["linked_package", "sourceless_package",
                                    "test_package", "exit_on_import", "atexit_exit",
                                    "disabled_asserts"])
def test_a_forgery_does_not_pass_an_unfixed_bug(attack: str) -> None:
    with Workspace(load_task("fix-median")) as ws:
        if attack == "linked_package":  # a. `unittest -> fakeut/`
            (ws.path / "fakeut").mkdir()
            (ws.path / "fakeut" / "__init__.py").write_text(FAKE_PACKAGE)
            (ws.path / "unittest").symlink_to("fakeut")
        elif attack == "sourceless_package":  # b. unittest/__init__.pyc with no .py
            (ws.path / "unittest").mkdir()
            (ws.path / "unittest" / "__init__.pyc").write_bytes(b"not even bytecode")
        elif attack == "test_package":  # c. test_stats_utils/ beats test_stats_utils.py
            (ws.path / "test_stats_utils").mkdir()
            (ws.path / "test_stats_utils" / "__init__.py").write_text("")
        elif attack == "exit_on_import":  # d. os._exit(0) when stats_utils is imported
            _prepend(ws, STOP_ON_IMPORT)
        elif attack == "atexit_exit":  # e. exit 0 forced while unittest says FAILED
            _prepend(ws, FORCE_EXIT)
        else:  # f. the assertions the tests use made no-ops
            _prepend(ws, NO_ASSERT)
        got = ws.validate()
        assert not got.passed, (attack, got.output)
        if attack in ("linked_package", "sourceless_package"):
            assert "unittest: shadows the standard-library module unittest" in got.output
        elif attack == "test_package":
            assert "instead of the task's test module test_stats_utils" in got.output
        elif attack == "exit_on_import":
            assert "no 'Ran N tests' line" in got.output
        elif attack == "disabled_asserts":
            assert "an assertion was disabled" in got.output


@pytest.mark.e2e
def test_the_canary_fails_as_written_when_the_fix_is_real() -> None:
    with Workspace(load_task("fix-median")) as ws:
        module = ws.path / "stats_utils.py"
        module.write_text(module.read_text().replace("    return ordered[middle]\n",
                                                     FIX + "    return ordered[middle]\n"))
        got = ws.validate()
        assert got.passed and got.returncode == 0, got.output
