"""Where things live: the checkout, its shipped data, caches, run state and results.

Shipped data (task workspaces, history files, the study's records) is found through one root,
`data_root()`: `COMPBENCH_DATA`, else the package data `compaction_bench.data` (the checkout's
`data/` folder in an editable install, the wheel's copy otherwise), so the suite finds it from
any working directory. What the suite writes (results, caches, pid files) goes under the
checkout in an editable install, else under the working directory.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

import compaction_bench


def repo_root() -> Path:
    """The checkout this package runs from (an editable install), else the working directory."""
    here = Path(compaction_bench.__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").is_file() else Path.cwd()


def data_root() -> Path:
    """Shipped data; `COMPBENCH_DATA` overrides it."""
    if os.environ.get("COMPBENCH_DATA"):
        return Path(os.environ["COMPBENCH_DATA"])
    return Path(str(files("compaction_bench.data")))


def histories_root() -> Path:
    """History files: `<root>/<task>/<arm>.json` and `<root>/study/<record>/<arm>.json`."""
    return Path(os.environ.get("COMPBENCH_HISTORIES") or data_root() / "histories")


def tasks_root() -> Path:
    """Task folders: `<root>/<task>/task.toml` and `workspace/`."""
    return data_root() / "tasks"


def study_root() -> Path:
    """The study's shipped records (`data/study/`, see its SOURCES.md)."""
    return data_root() / "study"


def cache_dir() -> Path:
    """Git-ignored folder for converted models and peer tools; `COMPBENCH_CACHE` overrides it."""
    return Path(os.environ.get("COMPBENCH_CACHE") or repo_root() / ".cache")


def run_state_dir() -> Path:
    """Pid files and server logs; `COMPBENCH_RUN_DIR` overrides it."""
    return Path(os.environ.get("COMPBENCH_RUN_DIR") or repo_root() / ".run")


def results_dir() -> Path:
    """Run folders; `COMPBENCH_RESULTS` overrides it."""
    return Path(os.environ.get("COMPBENCH_RESULTS") or repo_root() / "results")
