"""Importers: other agents' records as history files.

`import_history(path)` detects the format; one function per format is exported too:

- our own history files (validated as they are);
- mini-swe-agent 2.x trajectories, "mini-swe-agent-1.1" (`import_minisweagent_v2`);
- mini-swe-agent 1.x trajectories, "mini-swe-agent-1" (`import_minisweagent_v1`);
- SWE-agent `.traj` (`import_swe_agent`);
- plain OpenAI message lists (`import_openai_messages`);
- the study's continuation records (`import_study_record`, two arms per record);
- OpenHands event streams (`openhands.py`);
- Claude Code session logs, JSON Lines (`claudecode.py`);
- Codex CLI session rollouts, JSON Lines (`codex.py`);
- request/response logs, one OpenAI request and its response per line (`requestlog.py`): the
  one format that keeps per-turn usage and wall time, so its import is a replay source.

Anything else is refused as "unrecognized format" with the list of `FORMATS`, never read as
one of them by accident: a JSON list is an OpenAI message list only when every item has a
`role`.

Fork selection (`normalize.build_history`): a fork the source marks (our files, our exports,
study records) is used, and a different `fork=` is refused; otherwise `fork=` is an index into
all messages of the file, and the default is the last action whose result was recorded (a run's
final `submit` has none), refused at import when no action qualifies. The choice and its reason
are in `provenance.fork_choice`. Messages after the fork are kept in `continuation`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import History, refusal
from compaction_bench.histories.format.importers.claudecode import (
    claude_code_from_data,
    is_claude_code_log,
)
from compaction_bench.histories.format.importers.codex import codex_from_data, is_codex_rollout
from compaction_bench.histories.format.importers.jsonlines import NotJson, read_source
from compaction_bench.histories.format.importers.minisweagent import (
    V1_FORMAT,
    V2_FORMAT,
    import_minisweagent_v1,
    import_minisweagent_v2,
    import_openai_messages,
    minisweagent_from_data,
    openai_messages_from_data,
)
from compaction_bench.histories.format.importers.openhands import (
    is_openhands_events,
    openhands_from_data,
)
from compaction_bench.histories.format.importers.requestlog import (
    is_request_log,
    request_log_from_data,
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
    "FORMATS",
    "detect_format",
    "import_history",
    "import_minisweagent_v1",
    "import_minisweagent_v2",
    "import_openai_messages",
    "import_study_record",
    "import_swe_agent",
    "write_study_histories",
]


# What `detect_format` names, and how a refusal describes each format to the user.
FORMATS = {
    "history": "a compaction-bench history file",
    "study": "a study continuation record (data/study/records)",
    "minisweagent-v2": "a mini-swe-agent 2.x trajectory (.traj.json)",
    "minisweagent-v1": "a mini-swe-agent 1.x trajectory (.traj.json)",
    "swe-agent": "a SWE-agent .traj",
    "openai-messages": "an OpenAI message list ([{role, content}, ...] or {messages: [...]})",
    "openhands": "an OpenHands event stream (a JSON list of events)",
    "claude-code": "a Claude Code session log (.jsonl)",
    "codex": "a Codex CLI session rollout (rollout-*.jsonl)",
    "request-log": "a request/response log (.jsonl, one {request, response} per line)",
}


def _list_format(items: list[Any]) -> str:
    if items and all(isinstance(m, dict) and "role" in m for m in items):
        return "openai-messages"
    for name, matches in (("request-log", is_request_log), ("codex", is_codex_rollout),
                          ("claude-code", is_claude_code_log),
                          ("openhands", is_openhands_events)):
        if matches(items):
            return name
    return "unknown"


def detect_format(data: object) -> str:
    """Name of the format of a parsed file (a JSON document, or a JSON Lines file as the list of
    its objects): a key of `FORMATS`, or "unknown"."""
    if isinstance(data, list):
        return _list_format(data)
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
    history = data.get("history")
    if isinstance(history, list) and is_openhands_events(history):
        return "openhands"  # one instance of an OpenHands evaluation's output
    if isinstance(data.get("trajectory"), list) or isinstance(history, list):
        return "swe-agent"
    messages = data.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m
                                          for m in messages):
        return "openai-messages"
    if is_request_log([data]):
        return "request-log"  # a log of one request
    return "unknown"


def _shape(data: object) -> str:
    """A few words on what an unrecognized file holds, for the refusal."""
    if isinstance(data, list):
        first = data[0] if data else None
        if isinstance(first, dict):
            return f"a list whose first item has keys {sorted(first)[:8]}"
        return f"a list of {len(data)} items" if data else "an empty list"
    if isinstance(data, dict):
        messages = data.get("messages")
        if isinstance(messages, list) and messages:
            first = messages[0]
            keys = sorted(first)[:8] if isinstance(first, dict) else type(first).__name__
            return (f"an object whose 'messages' are not OpenAI messages (each needs a 'role'; "
                    f"the first has keys {keys})")
        return f"an object with keys {sorted(data)[:8]}"
    return f"a JSON {type(data).__name__}"


def import_history(path: str | Path, *, task: str | None = None, fork: int | None = None,
                   arm: str | None = None) -> History:
    """Import any supported file as one History (format detected from the content).

    `task` overrides the task id; `fork` picks the fork's assistant message index; `arm` names
    the arm (for a study record it picks the branch: "clean", the default, or "external").
    Every refusal is a `HistoryError` naming the file, the message index and the field.
    """
    origin = str(path)
    try:
        data = read_source(path)
    except NotJson as text:
        raise refusal(origin, f"unrecognized format (text that is not JSON, opening "
                      f"{text.first_line[:60]!r}): expected one of "
                      + "; ".join(FORMATS.values())) from None
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
    readers = {"openai-messages": openai_messages_from_data, "openhands": openhands_from_data,
               "claude-code": claude_code_from_data, "codex": codex_from_data,
               "request-log": request_log_from_data}
    if kind in readers:
        return readers[kind](data, path, task=task, fork=fork, arm=arm)
    raise refusal(origin, f"unrecognized format ({_shape(data)}): expected one of "
                  + "; ".join(FORMATS.values()) + _hint(data))


def _hint(data: object) -> str:
    """What to do with a file that is almost a known format."""
    if isinstance(data, list) and len(data) > 1 and all(
            isinstance(d, dict) and isinstance(d.get("history"), list) for d in data):
        return (f" (this looks like an evaluation output of {len(data)} instances, one per "
                "line: import one at a time, e.g. `head -n 1 output.jsonl > one.json`)")
    return ""
