"""Export a history as a mini-swe-agent trajectory (trajectory_format "mini-swe-agent-1.1").

The export is what mini-swe-agent itself writes: `messages` unchanged, `info` with exit_status,
submission and model_stats, and `trajectory_format`. Our metadata stays in the top-level
`extra` (mini-swe-agent merges extra top-level keys into its own files and its inspector reads
only `messages`), so `import_history(export)` gives back the same history. Only our
`history_format`/`history_version` markers are dropped: with them the file would be a history
file again rather than a plain trajectory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, write_json
from compaction_bench.histories.format.importers.normalize import minisweagent_info


def export_minisweagent(history: History) -> dict[str, Any]:
    """A mini-swe-agent 1.1 trajectory of `history` (a deep copy; the history is not changed)."""
    data = copy.deepcopy(history.to_json())
    del data["history_format"], data["history_version"]
    data["info"] = minisweagent_info(data["info"])
    return data


def write_minisweagent(history: History, path: str | Path) -> None:
    """Write `export_minisweagent(history)` atomically to `path` (e.g. `x.traj.json`)."""
    write_json(path, export_minisweagent(history))
