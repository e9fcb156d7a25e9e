"""What a repository task's validation runs on: the agent's files with the task's own tests put
back, and no module of the agent's that would change what the tests mean.

Validation runs in a copy of the workspace (never in the agent's tree, which stays as the agent
left it), where every test file of the pristine task (`test_*.py`, `*_test.py`, `conftest.py`)
is restored byte for byte. Before anything runs, the copy is refused when it holds a module the
pristine task does not have that would shadow what the tests import or how Python starts: a
standard-library name (`unittest.py`, a `json/` package, `unittest.cpython-311-...so`),
`sitecustomize`/`usercustomize`, or a `conftest.py`; looked for in every folder a test file
lives in, which the interpreter puts first on `sys.path`. The box sets PYTHONNOUSERSITE=1, so
user site-packages under its home (the workspace) are not read either. A module here is a file
of any import suffix (`.py`, `.pyc`, an extension) or a folder holding an `__init__` of any
suffix, a linked folder included; the task's own test modules are protected too (a
`test_x/` package or `test_x.so` would be imported instead of the restored `test_x.py`).

A unittest validation (`python3 -m unittest ...`) is judged on what unittest printed, not on its
exit code alone (an `os._exit(0)` or an `atexit` hook sets that): it must report at least as
many tests as the task's test files define, and `OK`. A **canary** test module with a random
name, written into the copy and added to the command, asserts things that are false (values
drawn per run); it must fail, exactly as written, or an assertion was disabled (a patched
`TestCase.assertEqual`) and validation fails.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import secrets
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.common.files import walk

TEST_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
SUFFIXES = tuple(sorted(importlib.machinery.all_suffixes(), key=len, reverse=True))
SKIPPED = (".git", "__pycache__")


def task_test_files(pristine: Path) -> list[Path]:
    """The task's own test files, relative to its pristine workspace."""
    found = {p.relative_to(pristine) for pattern in TEST_PATTERNS
             for p in pristine.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    return sorted(found)


def _module_name(entry: Path) -> str | None:
    """The module an entry of a sys.path folder provides, if any: a file of an import suffix, or
    a regular package (a folder, linked or not, holding `__init__` of any import suffix; a
    folder without one is a namespace portion, which a module of the same name wins over)."""
    if entry.is_dir():
        return entry.name if any((entry / f"__init__{suffix}").exists()
                                 for suffix in SUFFIXES) else None
    for suffix in SUFFIXES:
        if entry.name.endswith(suffix):
            return entry.name[: -len(suffix)].split(".")[0]
    return None


def shadowing(folder: Path, pristine: Path) -> list[str]:
    """Why `folder` may not be validated: each shadowing module the pristine task lacks, as
    'path: what it shadows' (empty: none)."""
    protected = set(sys.stdlib_module_names) | STARTUP_MODULES
    tests = {p.stem for p in task_test_files(pristine)}
    roots = {Path(".")} | {p.parent for p in task_test_files(pristine)}
    found = []
    for root in sorted(roots):
        here = folder / root
        if not here.is_dir():
            continue
        for entry in sorted(here.iterdir()):
            relative = entry.relative_to(folder)
            if (pristine / relative).exists() or (pristine / relative).is_symlink():
                continue
            name = _module_name(entry)
            if entry.name == "conftest.py":
                found.append(f"{relative}: a conftest.py the task does not have (pytest "
                             "would load it)")
            elif name in STARTUP_MODULES:
                found.append(f"{relative}: {name} runs at interpreter start")
            elif name in protected:
                found.append(f"{relative}: shadows the standard-library module {name}")
            elif name in tests:
                found.append(f"{relative}: would be imported instead of the task's test "
                             f"module {name}")
    return found


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


def validation_copy(workspace: Path, pristine: Path, dest: Path) -> list[Path]:
    """Copy `workspace` into `dest` (links kept as links) and put the task's own test files
    back from `pristine`; the restored files, relative."""
    copy_tree(workspace, dest)
    restored = task_test_files(pristine)
    for relative in restored:
        here = dest
        for part in relative.parts:  # a link anywhere on the way could point out of the copy
            here = here / part
            if here.is_symlink() or (here.exists() and not here.is_dir()
                                     and here != dest / relative):
                here.unlink()
        target = dest / relative
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine / relative, target, follow_symlinks=False)
    return restored
