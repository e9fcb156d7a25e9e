"""Importers: other agents' records as history files.

`import_history(path)` detects the format; one function per format is exported too:

- our own history files (validated as they are);
- mini-swe-agent 2.x trajectories, "mini-swe-agent-1.1" (`import_minisweagent_v2`);
- mini-swe-agent 1.x trajectories, "mini-swe-agent-1" (`import_minisweagent_v1`);
- SWE-agent `.traj` (`import_swe_agent`);
- plain OpenAI message lists (`import_openai_messages`);
- the study's continuation records (`import_study_record`, two arms per record).

Fork selection: a fork the source marks (our files, our exports, study records) is used, and a
different `fork=` is refused; otherwise `fork=` picks the assistant message index, and the default
is the last assistant turn with an action. Messages after the fork are kept in `continuation`.
"""

from __future__ import annotations

from pathlib import Path

from compaction_bench.histories.format.history import History, parse_json_file, refusal
from compaction_bench.histories.format.importers.minisweagent import (
    V1_FORMAT,
    V2_FORMAT,
    import_minisweagent_v1,
    import_minisweagent_v2,
    import_openai_messages,
    minisweagent_from_data,
    openai_messages_from_data,
)
from compaction_bench.histories.format.importers.study import (
    import_study_record,
    is_study_record,
    study_histories_from_data,
    write_study_histories,
)
from compaction_bench.histories.format.importers.sweagent import (
    import_swe_agent,
    sweagent_from_data,
)

__all__ = [
    "detect_format",
    "import_history",
    "import_minisweagent_v1",
    "import_minisweagent_v2",
    "import_openai_messages",
    "import_study_record",
    "import_swe_agent",
    "write_study_histories",
]


def detect_format(data: object) -> str:
    """Name of the format of parsed JSON: history, study, minisweagent-v2, minisweagent-v1,
    swe-agent, openai-messages; "unknown" otherwise."""
    if isinstance(data, list):
        return "openai-messages"
    if not isinstance(data, dict):
        return "unknown"
    if "history_format" in data:
        return "history"
    if is_study_record(data):
        return "study"
    fmt = data.get("trajectory_format")
    if fmt == V2_FORMAT:
        return "minisweagent-v2"
    if fmt == V1_FORMAT:
        return "minisweagent-v1"
    if isinstance(data.get("trajectory"), list) or isinstance(data.get("history"), list):
        return "swe-agent"
    if isinstance(data.get("messages"), list):
        return "openai-messages"
    return "unknown"


def import_history(path: str | Path, *, task: str | None = None, fork: int | None = None,
                   arm: str | None = None) -> History:
    """Import any supported file as one History (format detected from the content).

    `task` overrides the task id; `fork` picks the fork's assistant message index; `arm` names
    the arm (for a study record it picks the branch: "clean", the default, or "external").
    Every refusal is a `HistoryError` naming the file, the message index and the field.
    """
    origin = str(path)
    data = parse_json_file(path)
    kind = detect_format(data)
    if kind == "history":
        history = History.from_json(data, origin=origin)
        marked = history.fork.message_index if history.fork else None
        if fork is not None and fork != marked:
            raise refusal(origin, f"the history's fork is at message {marked}; re-forking a "
                          "history file is not supported (import the original trajectory)",
                          index=fork, field_name="fork")
        history.task = task or history.task
        history.arm = arm or history.arm
        return history
    if kind == "study":
        arms = study_histories_from_data(data, path, task=task, fork=fork)
        chosen = arm or "clean"
        if chosen not in arms:
            raise refusal(origin, f"a study record has arms {sorted(arms)}, not {chosen!r}",
                          field_name="arm")
        return arms[chosen]
    if kind in ("minisweagent-v2", "minisweagent-v1"):
        return minisweagent_from_data(data, path, task=task, fork=fork, arm=arm)
    if kind == "swe-agent":
        return sweagent_from_data(data, path, task=task, fork=fork, arm=arm)
    if kind == "openai-messages":
        return openai_messages_from_data(data, path, task=task, fork=fork, arm=arm)
    raise refusal(origin, "unrecognized format (expected a history file, a mini-swe-agent "
                  "trajectory, a SWE-agent .traj, an OpenAI message list or a study record)")
