"""Files the suite writes: whole files atomically, records one JSON line at a time.

Contracts:
- `write_bytes_atomic` / `write_text_atomic` / `write_json_atomic`: a temp file in the same
  folder, fsync, `os.replace`, mode 0644. Readers see the old file or the new one, never half.
- `JsonlWriter.write` encodes the whole line first and hands it to the kernel in one `os.write`
  on a file opened with O_APPEND, so several processes (locust workers, the bench's arms) append
  to one file without interleaving, and a crash loses at most the line being written. A file
  whose last line was torn by a crash gets a newline first, so the next record starts clean.
  JSON is strict: a non-finite float (NaN, inf) is written as null.
- `read_jsonl` returns every object line with its line number and every unusable line as an
  issue (a torn last line says so); it never raises on content.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from compaction_bench.common.errors import SuiteError

SCHEMA = 2  # every run record line carries "schema": SCHEMA (bench/analysis/summary_schema.md)


class RecordWriteError(SuiteError):
    """A record could not be written (disk full, folder gone); the message names the file."""


def strict(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, so it serializes as strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def dumps_line(record: dict[str, Any]) -> bytes:
    """One record as a strict JSON line (compact, UTF-8 kept, newline-terminated)."""
    return (json.dumps(strict(record), ensure_ascii=False, separators=(",", ":"),
                       allow_nan=False) + "\n").encode()


def write_bytes_atomic(path: str | Path, data: bytes, *, durable: bool = True) -> None:
    """Write a whole file atomically (see the module contract); errors name the file.

    `durable=False` skips the fsync: for status files rewritten twice a second by processes
    whose timing matters (an fsync blocks a gevent loop), where losing one on a crash is fine.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared and read
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise RecordWriteError(f"{target}: cannot write ({exc.strerror or exc}); the previous "
                               "file, if any, is unchanged") from exc
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str, *, durable: bool = True) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_json_atomic(path: str | Path, value: Any, *, indent: int | None = 2,
                      durable: bool = True) -> None:
    """Strict JSON (non-finite floats become null), atomically."""
    text = json.dumps(strict(value), indent=indent, ensure_ascii=False, allow_nan=False)
    write_text_atomic(path, text + "\n", durable=durable)


def _ends_torn(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


class JsonlWriter:
    """Append-only JSONL writer; safe across threads, greenlets and processes (see module)."""

    def __init__(self, path: str | Path, *, schema: int | None = SCHEMA) -> None:
        self.path = Path(path)
        self.schema = schema
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self.torn_line_repaired = False
        reader = os.open(self.path, os.O_RDONLY)
        try:
            if _ends_torn(reader):  # a crash cut the last line: start ours on a fresh one
                self._write_all(b"\n")
                self.torn_line_repaired = True
        finally:
            os.close(reader)

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` (with `schema` first, unless the writer has none) as one line."""
        line = {"schema": self.schema, **record} if self.schema is not None else record
        data = dumps_line(line)
        with self._lock:
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        if self._fd is None:
            raise RecordWriteError(f"{self.path}: writer is closed")
        view = memoryview(data)
        try:
            while view:  # a regular file takes it in one write; loop only on a short write
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            raise RecordWriteError(
                f"{self.path}: cannot append a record ({exc.strerror or exc}); records written "
                "before it are kept, and the next writer starts on a fresh line") from exc

    def sync(self) -> None:
        """fsync the file (the bench calls it at block ends)."""
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Open, append one line (fsynced) and close: for files written a line now and then."""
    with JsonlWriter(path, schema=None) as writer:
        writer.write(record)


@dataclass(frozen=True)
class LineIssue:
    """A line of a JSONL file that could not be used."""

    line: int
    reason: str
    value: Any = None  # the decoded value where the line was JSON but not an object


@dataclass(frozen=True)
class JsonlRead:
    """Every object line of a file with its number, and every unusable line."""

    rows: list[tuple[int, dict[str, Any]]]
    issues: list[LineIssue]

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [row for _, row in self.rows]


def read_jsonl(path: str | Path) -> JsonlRead:
    """Read a JSONL file (a missing file reads as empty); bad lines become issues."""
    rows: list[tuple[int, dict[str, Any]]] = []
    issues: list[LineIssue] = []
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return JsonlRead(rows, issues)
    lines = data.split(b"\n")
    last = len(lines) - 1 if lines and lines[-1] else len(lines) - 2  # index of the final line
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        number = index + 1
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            issues.append(LineIssue(number, "not UTF-8 text"))
            continue
        except RecursionError:  # arrays nested past Python's limit
            issues.append(LineIssue(number, "not usable JSON: nested too deeply"))
            continue
        except json.JSONDecodeError as exc:
            if index == last and not data.endswith(b"\n"):
                torn = " (last line cut short: a crash while it was written)"
            elif exc.msg.startswith("Unterminated string") or exc.pos >= len(raw.rstrip()):
                # valid as far as it goes: cut by a crash, then a writer started a fresh line
                torn = (" (line cut short: a crash while it was written; the next writer "
                        "started on a fresh line)")
            else:
                torn = ""
            issues.append(LineIssue(number, f"not valid JSON: {exc.msg}{torn}"))
            continue
        if isinstance(value, dict):
            rows.append((number, value))
        else:
            issues.append(LineIssue(number, f"not a JSON object ({type(value).__name__})", value))
    return JsonlRead(rows, issues)


def walk(root: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(root)` top-down without recursion (a tree 1,100 folders deep, which an agent can
    make, passes Python's recursion limit in `os.walk` and `shutil.copytree`): yields (folder,
    subfolders, other names) in sorted order; pruning `subfolders` in place skips them. Links to
    folders are listed with the names and never followed."""
    stack = [os.fspath(root)]
    while stack:
        folder = stack.pop()
        dirs: list[str] = []
        names: list[str] = []
        with os.scandir(folder) as entries:
            for entry in entries:
                (dirs if entry.is_dir(follow_symlinks=False) else names).append(entry.name)
        dirs.sort()
        names.sort()
        yield folder, dirs, names
        stack.extend(os.path.join(folder, d) for d in reversed(dirs))


def remove_tree(root: str | Path) -> None:
    """`shutil.rmtree(root, ignore_errors=True)` at any depth (shutil's recursion stops near
    1,000 levels with a RecursionError, which ignore_errors does not catch): files and links
    first, then folders deepest first; what cannot be removed is left."""
    if not os.path.lexists(root):
        return
    if os.path.islink(root) or not os.path.isdir(root):
        with contextlib.suppress(OSError):
            os.unlink(root)
        return
    folders = []
    for folder, _dirs, names in walk(root):
        folders.append(folder)
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
