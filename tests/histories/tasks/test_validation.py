"""Validation the agent cannot forge: a tree built from the pristine task and the agent's patch,
refused when the patch holds more than source, run by an isolated interpreter and judged on
unittest's own report with a canary. The unit tests read real folders and made-up patches; the
e2e tests run the task's validation in the real box."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compaction_bench.common.files import remove_tree
from compaction_bench.histories.agent.capture import Change
from compaction_bench.histories.agent.workspace import Workspace
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.histories.tasks.validation import (
    RUNNER,
    Canary,
    expected_tests,
    isolated_command,
    refusal_line,
    refusals,
    task_test_files,
    unittest_verdict,
    validation_tree,
)

FAKE_UNITTEST = "import sys\nsys.exit(0)\n"
FIX = ("    if len(ordered) % 2 == 0:\n"
       "        return (ordered[middle - 1] + ordered[middle]) / 2\n")
OID = "1" * 40


def added(path: str, mode: str = "100644") -> Change:
    return Change(path, "A", "000000", mode, OID)


def changed(path: str, mode: str = "100644", status: str = "M") -> Change:
    return Change(path, status, "100644", mode, OID)


def deleted(path: str) -> Change:
    return Change(path, "D", "100644", "000000", "0" * 40)


def test_the_task_test_files_are_found_in_the_pristine_tree() -> None:
    assert task_test_files(load_task("fix-median").workspace) == [Path("test_stats_utils.py")]


def test_a_patch_of_source_files_is_not_refused() -> None:
    pristine = load_task("fix-median").workspace
    assert refusals([changed("stats_utils.py"), changed("stats_utils.py", "100755"),
                     added("helpers.py"), added("notes/README.md"), added("email/x.py"),
                     added("pkg/__init__.py"), added("zz.pth"), added("caf\udce9.txt"),
                     added("/".join(["d"] * 1100 + ["f"])), deleted("stats_utils.py")],
                    pristine) == []


def test_a_patch_that_touches_a_test_file_is_refused_naming_it() -> None:
    pristine = load_task("fix-median").workspace
    assert refusals([changed("test_stats_utils.py")], pristine) == [
        "test_stats_utils.py: a test file of the task (the patch may not change it: the "
        "task's own tests judge the fix)"]
    assert "may not delete it" in refusals([deleted("test_stats_utils.py")], pristine)[0]
    # replaced by a link, or new test files a runner would load
    assert refusals([changed("test_stats_utils.py", "120000", "T")], pristine)[0].startswith(
        "test_stats_utils.py: a test file of the task")
    found = refusals([added("test_repro.py"), added("sub/conftest.py"), added("tests.py"),
                      added("x_test.py")], pristine)
    assert [line.split(":")[0] for line in found] == [
        "test_repro.py", "sub/conftest.py", "tests.py", "x_test.py"]
    assert all("a test file the task does not have" in line for line in found)


def test_a_patch_that_adds_bytecode_or_a_link_is_refused_naming_it() -> None:
    pristine = load_task("fix-median").workspace
    found = refusals([added("helper.pyc"), added("unittest/__init__.pyc"),
                      added("fast.cpython-311-x86_64-linux-gnu.so"), added("old.pyo"),
                      added("pkg/__pycache__/m.cpython-311.pyc"), added("data.pyc.txt")],
                     pristine)
    assert [line.split(":")[0] for line in found] == [
        "helper.pyc", "unittest/__init__.pyc", "fast.cpython-311-x86_64-linux-gnu.so", "old.pyo",
        "pkg/__pycache__/m.cpython-311.pyc"]
    assert all(line.endswith(": compiled code (bytecode or an extension module; the patch may "
                             "hold source only)") for line in found)
    assert refusals([added("unittest", "120000"), changed("stats_utils.py", "120000", "T")],
                    pristine) == [
        "unittest: a symbolic link (the patch may hold regular files only)",
        "stats_utils.py: a symbolic link (the patch may hold regular files only)"]
    assert refusals([added("vendored", "160000")], pristine) == [
        "vendored: not a regular file (mode 160000)"]


def test_a_patch_that_adds_a_shadowing_module_is_refused_naming_it() -> None:
    pristine = load_task("fix-median").workspace
    found = refusals([added("unittest.py"), added("json/__init__.py"), added("json/x.py"),
                      added("sitecustomize.py"), added("usercustomize/__init__.py"),
                      added("test_stats_utils/__init__.py"), added("sub/unittest.py")], pristine)
    assert found == [
        "unittest.py: shadows the standard-library module unittest",
        "json: shadows the standard-library module json",
        "sitecustomize.py: sitecustomize runs at interpreter start",
        "usercustomize: usercustomize runs at interpreter start",
        "test_stats_utils: would be imported instead of the task's test module "
        "test_stats_utils"]  # sub/ is on no sys.path: sub/unittest.py shadows nothing
    # one line, however many
    line = refusal_line([f"m{i}.pyc: compiled code" for i in range(12)])
    assert "\n" not in line and line.startswith("validation refused: m0.pyc: compiled code")
    assert "; and 7 more; the patch may change the task's source files only" in line
    # a name that is not UTF-8, or holds a newline, is shown escaped on the one line
    assert refusals([added("caf\udce9.pyc"), added("a\nb.pyc")], pristine)[0].startswith(
        "'caf\\udce9.pyc': ")
    assert "\n" not in refusal_line(refusals([added("a\nb.pyc")], pristine))


def test_the_validation_tree_is_the_pristine_tree_with_the_patch_applied(
        tmp_path: Path) -> None:
    pristine, dest = tmp_path / "pristine", tmp_path / "dest"
    (pristine / "pkg").mkdir(parents=True)
    (pristine / "mod.py").write_text("old\n")
    (pristine / "gone.py").write_text("x\n")
    (pristine / "pkg" / "only.py").write_text("y\n")
    (pristine / "__pycache__").mkdir()
    (pristine / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"cache")
    dest.mkdir()
    deep = "/".join(["d"] * 1100 + ["f"])  # deeper than Python's recursion limit
    changes = [changed("mod.py", "100755"), deleted("gone.py"), deleted("pkg/only.py"),
               added("pkg"), added("caf\udce9.txt"), added(deep)]
    try:
        validation_tree(pristine, dest, changes,
                        iter([b"new\n", b"file\n", b"\xe9\n", b"deep\n"]))
        _check_tree(dest)
    finally:  # pytest's own clean-up of tmp_path recurses, and would fail at this depth
        remove_tree(dest)


def _check_tree(dest: Path) -> None:
    assert (dest / "mod.py").read_bytes() == b"new\n"
    assert os.stat(dest / "mod.py").st_mode & 0o777 == 0o755
    assert not (dest / "gone.py").exists() and not (dest / "__pycache__").exists()
    assert (dest / "pkg").read_bytes() == b"file\n"  # the folder it emptied became a file
    assert (dest / "caf\udce9.txt").read_bytes() == b"\xe9\n"
    fd = os.open(dest, os.O_RDONLY)
    try:
        for _ in range(1100):
            step = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
        leaf = os.open("f", os.O_RDONLY, dir_fd=fd)
        assert os.read(leaf, 10) == b"deep\n"
        os.close(leaf)
    finally:
        os.close(fd)


def test_the_validation_tree_never_writes_through_a_link(tmp_path: Path) -> None:
    pristine, dest, outside = tmp_path / "pristine", tmp_path / "dest", tmp_path / "outside"
    pristine.mkdir()
    outside.mkdir()
    (pristine / "out").symlink_to(outside)  # a task that ships a link (none does today)
    dest.mkdir()
    with pytest.raises(OSError):
        validation_tree(pristine, dest, [added("out/x.py")], iter([b"escaped"]))
    assert list(outside.iterdir()) == []


def test_unittest_runs_isolated_and_other_commands_as_written() -> None:
    got = isolated_command("python3 -m unittest -q test_stats_utils", ["test_zz_1"])
    assert got is not None
    assert got.startswith("python3 -I -B -c ") and got.endswith(" -q test_stats_utils test_zz_1")
    assert RUNNER in got.replace("'\"'\"'", "'")
    for command in ("python3 -m unittest x && true", "cd sub; python3 -m unittest",
                    "python3 -m pytest -q", "make test", "python3 -m unittest $(ls)",
                    "python3 -m unittest 'unclosed"):
        assert isolated_command(command) is None, command


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


@pytest.mark.e2e
def test_a_shadowed_unittest_does_not_pass_an_unfixed_bug() -> None:
    with Workspace(load_task("fix-median")) as ws:
        (ws.path / "unittest.py").write_text(FAKE_UNITTEST)
        got = ws.validate()
        assert not got.passed and "unittest.py: shadows the standard-library module" in got.output


def _fix(ws: Workspace) -> None:
    module = ws.path / "stats_utils.py"
    module.write_text(module.read_text().replace("    return ordered[middle]\n",
                                                 FIX + "    return ordered[middle]\n"))


@pytest.mark.e2e
def test_a_patch_that_edits_the_tests_is_refused_and_the_agents_tree_left_as_it_was() -> None:
    with Workspace(load_task("fix-median")) as ws:
        tests = ws.path / "test_stats_utils.py"
        pristine = tests.read_text()
        _fix(ws)  # a real fix, beside edited tests: still refused
        tests.write_text("import unittest\nclass T(unittest.TestCase):\n"
                         "    def test_ok(self):\n        pass\n")
        forged = tests.read_text()
        got = ws.validate()
        assert not got.passed and got.output.startswith(
            "validation refused: test_stats_utils.py: a test file of the task"), got.output
        assert "\n" not in got.output
        assert tests.read_text() == forged  # validation never touches the agent's tree
        tests.write_text(pristine)  # put back as it was: no longer part of the patch
        got = ws.validate()
        assert got.passed, got.output


@pytest.mark.e2e
def test_a_patch_that_adds_bytecode_or_a_link_is_refused() -> None:
    with Workspace(load_task("fix-median")) as ws:
        _fix(ws)
        (ws.path / "__pycache__").mkdir()  # a cache the agent's own test runs left: dropped
        (ws.path / "__pycache__" / "stats_utils.cpython-311.pyc").write_bytes(b"stale")
        assert ws.validate().passed
        (ws.path / "helper.pyc").write_bytes(b"\x00bytecode")
        got = ws.validate()
        assert not got.passed and got.output.startswith(
            "validation refused: helper.pyc: compiled code"), got.output
        (ws.path / "helper.pyc").unlink()
        (ws.path / "median.py").symlink_to("stats_utils.py")
        got = ws.validate()
        assert not got.passed and got.output.startswith(
            "validation refused: median.py: a symbolic link"), got.output


@pytest.mark.e2e
def test_a_pth_file_in_the_tree_does_nothing_to_the_isolated_interpreter() -> None:
    with Workspace(load_task("fix-median")) as ws:
        _fix(ws)
        module = ws.path / "stats_utils.py"
        module.write_text("import sys\nprint('ISOLATED', sys.flags.isolated, "
                          "sys.flags.no_user_site)\n" + module.read_text())
        pth = "import sys; print('PTH-RAN'); sys.stdout.flush()\n"
        for minor in range(8, 16):  # HOME is the tree: its user site, whatever the version
            site = ws.path / ".local" / "lib" / f"python3.{minor}" / "site-packages"
            site.mkdir(parents=True)
            (site / "zz.pth").write_text(pth)
        (ws.path / "zz.pth").write_text(pth)
        got = ws.validate()
        assert got.passed, got.output
        assert "ISOLATED 1 1" in got.output and "PTH-RAN" not in got.output, got.output


@pytest.mark.e2e
def test_nothing_in_the_tree_shadows_the_isolated_interpreters_modules() -> None:
    """Past the refusals, as if one were missed: the tree's unittest/, sitecustomize.py and
    .pth files are never read, even with PYTHONPATH and user site-packages turned on, where
    the command as written reads all three."""
    with Workspace(load_task("fix-median")) as ws:
        assert ws.sandbox is not None
        (ws.path / "unittest").mkdir()
        (ws.path / "unittest" / "__init__.py").write_text(
            "import sys\nprint('FAKE-UNITTEST')\nsys.exit(0)\n")
        (ws.path / "sitecustomize.py").write_text("print('SITECUSTOMIZE-RAN')\n")
        site = ws.path / ".local" / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (site / "zz.pth").write_text("import sys; print('PTH-RAN')\n")
        unsafe = "env -u PYTHONNOUSERSITE PYTHONPATH=. "
        written = ws.sandbox.run(unsafe + "python3 -m unittest -q test_stats_utils",
                                 timeout_s=60).output
        assert "FAKE-UNITTEST" in written and "SITECUSTOMIZE-RAN" in written, written
        command = isolated_command("python3 -m unittest -q test_stats_utils")
        assert command is not None
        got = ws.sandbox.run(unsafe + command, timeout_s=60).output
        assert "Ran 5 tests" in got and "FAILED" in got, got  # the real unittest, the real bug
        assert not any(mark in got for mark in ("FAKE-UNITTEST", "SITECUSTOMIZE-RAN", "PTH-RAN"))


@pytest.mark.e2e
def test_a_workspace_the_capture_refuses_fails_validation_in_one_line() -> None:
    with Workspace(load_task("fix-median")) as ws:
        (ws.path / ".GIT").mkdir()
        (ws.path / ".GIT" / "x").write_text("x\n")
        got = ws.validate()
        assert not got.passed and got.output.startswith(
            "validation refused: patch capture: git refuses the path '.GIT/x'"), got.output


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
        if attack == "linked_package":
            assert "unittest: a symbolic link" in got.output
        elif attack == "sourceless_package":
            assert "unittest/__init__.pyc: compiled code" in got.output
        elif attack == "test_package":
            assert "instead of the task's test module test_stats_utils" in got.output
        elif attack == "exit_on_import":
            assert "no 'Ran N tests' line" in got.output
        elif attack == "disabled_asserts":
            assert "an assertion was disabled" in got.output


@pytest.mark.e2e
def test_the_canary_fails_as_written_when_the_fix_is_real() -> None:
    with Workspace(load_task("fix-median")) as ws:
        _fix(ws)
        got = ws.validate()
        assert got.passed and got.returncode == 0, got.output
