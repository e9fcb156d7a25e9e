"""What a repository task's validation runs on, and how: the pristine task with only the
agent's patch applied, in an interpreter that starts isolated.

The tree is built host-side, never copied from the workspace: the pristine task tree (`copy_tree`
of the task's own folder) with each path of the agent's patch written from the suite's own
capture repository (`capture.Snapshots.changes` and `.contents`, the blobs the patch was made
from, byte for byte; `validation_tree`). Nothing else of the workspace reaches it: no
`__pycache__` (capture leaves it out), no `.git`, no file the patch does not name.

The patch may change the task's source files only. `refusals` names, one reason a path, a patch
that changes or deletes one of the task's test files (`test_*.py`, `*_test.py`, `conftest.py`),
adds a file a test runner would load (`test*.py`, unittest discover's pattern, `*_test.py`, a
`conftest.py`), adds a symbolic link or anything but a regular file, adds compiled code
(bytecode `.pyc`/`.pyo`, an extension module, anything under `__pycache__`), or adds a module that
would shadow what the tests import or how Python starts: a standard-library name (`unittest.py`,
a `json/` package), `sitecustomize`/`usercustomize`, or one of the task's test modules (a
`test_x/` package would be imported instead of the restored `test_x.py`), in every folder a
test file lives in. A refused patch is never validated: validation fails with the line.

A unittest validation (`python3 -m unittest ARGS`) runs as `python3 -I -B -c RUNNER ARGS`
(`isolated_command`): no PYTHON* variable, no user site-packages (so no `.pth` of the tree's,
not even one under its HOME), no script folder first on `sys.path`; the runner appends the tree
to the END of `sys.path` and runs unittest's own `__main__` as `-m` would, so nothing in the
tree can shadow a standard-library or installed module, and a `sitecustomize.py` there is
never found. It is judged on what unittest printed, not on its exit code alone (an
`os._exit(0)` or an `atexit` hook sets that): it must report at least as many tests as the
task's test files define, and `OK`. A **canary** test module with a random name, written into
the tree and added to the command, asserts things that are false (values drawn per run); it
must fail, exactly as written, or an assertion was disabled (a patched `TestCase.assertEqual`)
and validation fails. Any other validation command runs as written, judged on its exit code.

What this does not stop: the report is read from the output of the process that imported the
agent's code, so that code can still print a report of its own (the canary's test names are in
the process it runs in) and exit; only checks computed in a process that never imports it
would close that (docs/faults.md).
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import importlib.machinery
import os
import re
import secrets
import shlex
import shutil
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from compaction_bench.common.files import walk
from compaction_bench.histories.agent.capture import Change

TEST_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")
# what a test runner loads that the task does not have: unittest discover's own pattern too
RUNNER_PATTERNS = ("test*.py", "*_test.py", "conftest.py")
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
SUFFIXES = tuple(sorted(importlib.machinery.all_suffixes(), key=len, reverse=True))
COMPILED = (*importlib.machinery.BYTECODE_SUFFIXES, ".pyo",
            *importlib.machinery.EXTENSION_SUFFIXES)
SKIPPED = (".git", "__pycache__")
REGULAR = ("100644", "100755")
SHOWN_REFUSALS = 5
# run as `python3 -I -B -c RUNNER ARGS`: the tree goes last on sys.path (-I puts nothing of
# the folder first), then unittest's __main__ runs as `-m unittest` runs it
RUNNER = ("import os, runpy, sys; sys.path.append(os.getcwd()); "
          "runpy.run_module('unittest', run_name='__main__', alter_sys=True)")
# a command with any of these is shell, not one argv: it runs as written
SHELL = re.compile(r"[;&|<>`$(){}*?\[\]!~#\n\\]")


def task_test_files(pristine: Path) -> list[Path]:
    """The task's own test files, relative to its pristine workspace."""
    found = {p.relative_to(pristine) for pattern in TEST_PATTERNS
             for p in pristine.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    return sorted(found)


def _module_of(name: str) -> str | None:
    """The module a file of this name provides on a sys.path folder (None: no import suffix)."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)].split(".")[0]
    return None


def _shown(path: str) -> str:
    """A path as one printable line (a name that is not UTF-8 or holds a newline, escaped)."""
    return path if path.isprintable() else ascii(path)


def _why(change: Change, tests: set[PurePosixPath],
         roots: set[PurePosixPath]) -> tuple[str, str] | None:
    """What the patch may not hold in `change` and why, as (the path to name, why); a shadowing
    package is named by its folder (None: it may hold it)."""
    path = PurePosixPath(change.path)
    if any(part in ("", ".", "..") for part in change.path.split("/")):
        return change.path, "not a path inside the task's tree"
    if path in tests:
        return change.path, (f"a test file of the task (the patch may not "
                             f"{'delete' if change.status == 'D' else 'change'} it: the task's "
                             "own tests judge the fix)")
    if change.status == "D":
        return None
    if change.new_mode == "120000":
        return change.path, "a symbolic link (the patch may hold regular files only)"
    if change.new_mode not in REGULAR:
        return change.path, f"not a regular file (mode {change.new_mode})"
    if "__pycache__" in path.parts or path.name.endswith(COMPILED):
        return change.path, ("compiled code (bytecode or an extension module; the patch may "
                             "hold source only)")
    if change.status != "A":  # a change to a file the task has: source
        return None
    if any(fnmatch.fnmatchcase(path.name, pattern) for pattern in RUNNER_PATTERNS):
        return change.path, ("a test file the task does not have (a test runner would load it; "
                             "the task's own tests judge the fix)")
    # a new module on a sys.path folder: a file there, or a package's __init__ one below
    named, name = change.path, _module_of(path.name) if path.parent in roots else None
    if name is None and path.name.startswith("__init__.") and path.parent.parent in roots:
        named, name = str(path.parent), path.parent.name
    if name in STARTUP_MODULES:
        return named, f"{name} runs at interpreter start"
    if name in sys.stdlib_module_names:
        return named, f"shadows the standard-library module {name}"
    if name in {p.stem for p in tests}:
        return named, f"would be imported instead of the task's test module {name}"
    return None


def refusals(changes: Sequence[Change], pristine: Path) -> list[str]:
    """Why the patch may not be validated (module docstring): 'path: why' for each path it may
    not hold (empty: the patch may be validated)."""
    tests = {PurePosixPath(p.as_posix()) for p in task_test_files(pristine)}
    roots = {PurePosixPath(".")} | {p.parent for p in tests}
    found: dict[str, str] = {}
    for change in changes:
        refused = _why(change, tests, roots)
        if refused is not None:
            found.setdefault(_shown(refused[0]), refused[1])
    return [f"{path}: {why}" for path, why in found.items()]


def refusal_line(refused: Sequence[str]) -> str:
    """The one line a refused patch fails validation with."""
    shown = "; ".join(refused[:SHOWN_REFUSALS])
    more = f"; and {len(refused) - SHOWN_REFUSALS} more" if len(refused) > SHOWN_REFUSALS else ""
    return (f"validation refused: {shown}{more}; the patch may change the task's source files "
            "only")


def expected_tests(pristine: Path) -> int:
    """How many test methods the task's own test files define (`def test*` in a class): what a
    unittest validation must report at least."""
    count = 0
    for relative in task_test_files(pristine):
        try:
            tree = ast.parse((pristine / relative).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        count += sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.name.startswith("test")
                     for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                     for node in cls.body)
    return count


@dataclass(frozen=True)
class Canary:
    """A test module that must fail, written into the validation copy: each test asserts a
    falsehood with one of unittest's assertions, its values drawn per run."""

    module: str
    source: str
    tests: int

    @classmethod
    def draw(cls) -> Canary:
        token = secrets.token_hex(6)
        a, b = secrets.randbelow(10**6), secrets.randbelow(10**6) + 10**6
        checks = {
            "equal": f"self.assertEqual({a}, {b})",
            "true": f"self.assertTrue({a} > {b})",
            "in": f"self.assertIn({a}, [{b}])",
            "raises": "with self.assertRaises(ValueError):\n            pass",
            "almost": f"self.assertAlmostEqual({a}.5, {b}.5)",
        }
        body = "".join(f"    def test_{name}_{token}(self):\n        {check}\n\n"
                       for name, check in checks.items())
        source = f"import unittest\n\n\nclass Check{token}(unittest.TestCase):\n{body}"
        return cls(module=f"test_zz_{token}", source=source, tests=len(checks))


def unittest_verdict(output: str, returncode: int, expected: int,
                     canary: Canary | None) -> tuple[bool, str]:
    """Whether unittest's own report says the task's tests passed: `Ran N tests` with N at least
    the task's tests (plus the canary's), every failure the canary's and each canary test
    failed, `OK` where there is no canary. (passed, why not)."""
    ran = [int(m.group(1)) for m in re.finditer(r"^Ran (\d+) tests? in ", output, re.M)]
    if not ran:
        return False, "unittest reported no run (no 'Ran N tests' line): the tests did not run"
    want = expected + (canary.tests if canary else 0)
    if ran[-1] < want:
        return False, (f"unittest ran {ran[-1]} tests, fewer than the {want} the task's test "
                       "files and the canary define")
    summary = output[output.rfind("\nRan "):]
    failed = set(re.findall(r"^(?:FAIL|ERROR): (\S+) \(", output, re.M))
    if canary is None:
        ok = re.search(r"^OK\b", summary, re.M) is not None and returncode == 0
        return ok, "" if ok else "unittest did not report OK"
    caught = {name for name in failed if name.endswith(canary.module.removeprefix("test_zz"))}
    if len(caught) != canary.tests:
        return False, (f"{canary.tests - len(caught)} of the canary's {canary.tests} false "
                       "assertions passed: an assertion was disabled")
    others = failed - caught
    if others:
        return False, f"failed: {', '.join(sorted(others))}"
    counts = re.search(r"^FAILED \((.*)\)", summary, re.M)
    if counts is None or counts.group(1) != f"failures={canary.tests}":
        return False, "unittest's summary does not match its failures"
    return True, ""


def _ignore(folder: str, names: list[str]) -> set[str]:
    """Leave out .git, caches and anything that is not a file, a folder or a link (a fifo
    would block the copy)."""
    left = set()
    for name in names:
        mode = os.lstat(os.path.join(folder, name)).st_mode
        if name in SKIPPED or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)
                                   or stat.S_ISLNK(mode)):
            left.add(name)
    return left


def copy_tree(source: Path, dest: Path) -> None:
    """`source` into `dest` at any depth (no recursion): folders, files and links (kept as
    links); .git, caches and anything else (fifos, sockets, devices) left out, as `_ignore`
    says."""
    for folder, dirs, names in walk(source):
        here = dest / os.path.relpath(folder, source)
        here.mkdir(parents=True, exist_ok=True)
        left = _ignore(folder, [*dirs, *names])
        dirs[:] = [d for d in dirs if d not in left]
        for name in names:
            if name in left:
                continue
            path = os.path.join(folder, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), here / name)
            else:
                shutil.copy2(path, here / name, follow_symlinks=False)


def isolated_command(command: str, extra: Sequence[str] = ()) -> str | None:
    """The task's `python3 -m unittest ARGS` (plus `extra` names) as the isolated interpreter
    runs it (module docstring); None where the command is not that one shape (a shell
    operator, another program), which then runs as written."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if (SHELL.search(command) or len(words) < 3 or words[0] not in ("python3", "python")
            or words[1:3] != ["-m", "unittest"]):
        return None
    return shlex.join([words[0], "-I", "-B", "-c", RUNNER, *words[3:], *extra])


def _folder_fd(dest: int, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of the folder `parts` below `dest`, each step opened without following a
    link (a link on the way is an error, never a way out of the tree); any depth."""
    fd = os.dup(dest)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def validation_tree(pristine: Path, dest: Path, changes: Sequence[Change],
                    contents: Iterable[bytes]) -> None:
    """The pristine task tree in `dest` with the patch applied: each deleted path removed (and
    folders it left empty), then each other change written from `contents`, the new blobs in
    the order of the changes that are not deletions. Refuse the patch first (`refusals`)."""
    copy_tree(pristine, dest)
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        emptied: set[PurePosixPath] = set()
        for change in changes:
            if change.status != "D":
                continue
            *folders, name = change.path.split("/")
            with contextlib.suppress(FileNotFoundError):
                fd = _folder_fd(root, folders, create=False)
                try:
                    os.unlink(name, dir_fd=fd)
                finally:
                    os.close(fd)
            emptied.update(PurePosixPath(change.path).parents)
        for folder in sorted(emptied - {PurePosixPath(".")}, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):  # not empty: it holds more than was deleted
                os.rmdir(str(folder), dir_fd=root)
        writes = [change for change in changes if change.status != "D"]
        for change, data in zip(writes, contents, strict=True):
            *folders, name = change.path.split("/")
            fd = _folder_fd(root, folders, create=True)
            try:
                if change.status == "T":  # a link the task had becomes a file
                    os.unlink(name, dir_fd=fd)
                mode = 0o755 if change.new_mode == "100755" else 0o644
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                              mode, dir_fd=fd)
                with os.fdopen(out, "wb") as handle:
                    handle.write(data)
                    os.fchmod(handle.fileno(), mode)
            finally:
                os.close(fd)
    finally:
        os.close(root)
