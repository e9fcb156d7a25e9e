"""Reading a file to import: one JSON document, or JSON Lines (one JSON object per line).

Session logs (Claude Code, Codex CLI) and request/response logs are JSON Lines; trajectories
and event streams are one JSON document. `read_source` tries the document first, so a `.json`
file's own errors are reported as they were; only a file whose first line is a JSON object of
its own is read line by line, and a bad line is refused by its number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import (
    MAX_JSON_DEPTH,
    HistoryError,
    json_depth,
    parse_json_file,
    refusal,
)


class NotJson(HistoryError):
    """The file is text that is not JSON at all (it opens with neither `{` nor `[`): an
    unrecognized format, not a broken JSON file. `first_line` is what it opens with."""

    def __init__(self, message: str, first_line: str) -> None:
        super().__init__(message)
        self.first_line = first_line


def read_source(path: str | Path) -> Any:
    """The parsed file: a JSON document as it is, a JSON Lines file as the list of its objects.

    Refusals are `HistoryError`s naming the file (and for JSON Lines the line number); text
    that is not JSON at all is `NotJson`."""
    try:
        return parse_json_file(path)
    except HistoryError as whole:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise whole from None
        lines = text.splitlines()
        first = next((line for line in lines if line.strip()), "")
        if not first.lstrip().startswith(("{", "[")):
            raise NotJson(str(whole), first.strip()) from None
        try:
            opening = json.loads(first)
        except (ValueError, RecursionError):
            raise whole from None  # not JSON Lines either: the document's own error
        if not isinstance(opening, dict):
            raise whole from None
        return _json_lines(lines, str(path))


def _json_lines(lines: list[str], origin: str) -> list[dict[str, Any]]:
    """Record i is line i + 1 (an empty line inside the file is refused, so importers can
    name a record by its line)."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        where = f"line {number}"
        if not line.strip():
            raise refusal(origin, "empty line (a JSON Lines file holds one JSON object per "
                          "line: delete it)", index=where)
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise refusal(origin, f"broken JSON at column {exc.colno}: {exc.msg} (a JSON Lines "
                          "file holds one JSON object per line; a log cut off mid-write ends "
                          "in a partial line: delete it)", index=where) from None
        except RecursionError:
            raise refusal(origin, f"JSON nested more than {MAX_JSON_DEPTH} levels deep",
                          index=where) from None
        if json_depth(value) > MAX_JSON_DEPTH:
            raise refusal(origin, f"JSON nested more than {MAX_JSON_DEPTH} levels deep",
                          index=where)
        if not isinstance(value, dict):
            raise refusal(origin, f"must be a JSON object, got {type(value).__name__}",
                          index=where)
        records.append(value)
    return records


def line(number: int) -> str:
    """How a refusal names record `number` (0-based) of a JSON Lines file."""
    return f"line {number + 1}"


def strip_suffixes(path: str | Path) -> str:
    """A task id from a log's file name: `x.jsonl`, `x.json` give `x`."""
    name = Path(path).name
    for suffix in (".jsonl", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
