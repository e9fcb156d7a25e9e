"""What a repository task's validation runs on: the agent's files with the task's own tests put
back, and no module of the agent's that would change what the tests mean.

Validation runs in a copy of the workspace (never in the agent's tree, which stays as the agent
left it), where every test file of the pristine task (`test_*.py`, `*_test.py`, `conftest.py`)
is restored byte for byte. Before anything runs, the copy is refused when it holds a module the
pristine task does not have that would shadow what the tests import or how Python starts: a
standard-library name (`unittest.py`, a `json/` package, `unittest.cpython-311-...so`),
`sitecustomize`/`usercustomize`, or a `conftest.py`; looked for in every folder a test file
lives in, which the interpreter puts first on `sys.path`. The box sets PYTHONNOUSERSITE=1, so
user site-packages under its home (the workspace) are not read either.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import stat
import sys
from pathlib import Path

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
    """The module an entry of a sys.path folder provides, if any."""
    if entry.is_dir() and not entry.is_symlink():
        return entry.name if (entry / "__init__.py").exists() else None
    for suffix in SUFFIXES:
        if entry.name.endswith(suffix):
            return entry.name[: -len(suffix)].split(".")[0]
    return None


def shadowing(folder: Path, pristine: Path) -> list[str]:
    """Why `folder` may not be validated: each shadowing module the pristine task lacks, as
    'path: what it shadows' (empty: none)."""
    protected = set(sys.stdlib_module_names) | STARTUP_MODULES
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
    return found


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


def validation_copy(workspace: Path, pristine: Path, dest: Path) -> list[Path]:
    """Copy `workspace` into `dest` (links kept as links) and put the task's own test files
    back from `pristine`; the restored files, relative."""
    shutil.copytree(workspace, dest, symlinks=True, ignore=_ignore, dirs_exist_ok=True)
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
