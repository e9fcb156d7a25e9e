"""Process groups, pid files and logs of the servers the suite starts.

A server runs in a process group of its own, so stopping it (`common.processtree.stop_tree`)
stops vLLM's engine processes too.
A background server leaves a pid file in the run-state folder (`common.paths.run_state_dir`)
carrying its pid, process group and the process's start time: `make stop` acts only on a pid
whose start time still matches, so a recycled pid is never signalled. A restart keeps the
previous log as `<log>.1` instead of overwriting the crashed server's last words.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.paths import run_state_dir
from compaction_bench.common.processtree import stop_tree
from compaction_bench.serve.share import remove_cgroup

LOG_TAIL_LINES = 25


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or '(no log)'."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def rotate_log(path: Path) -> None:
    """Keep an existing log as `<name>.1` (one generation), so a restart never erases it."""
    if path.exists() and path.stat().st_size:
        os.replace(path, path.with_name(path.name + ".1"))


def start_time(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), or None when it is gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def pid_file(port: int) -> Path:
    return run_state_dir() / f"server-{port}.json"


def write_pid_file(port: int, record: dict[str, Any]) -> None:
    """Record a background server: pid, process group, start time and what it serves."""
    write_json_atomic(pid_file(port), {**record, "pid_started": start_time(record["pid"]),
                                       "recorded": time.time()}, indent=None)


def read_pid_files(port: int | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable pid file (all ports, or one); unreadable files are skipped."""
    found = []
    for path in sorted(run_state_dir().glob("server-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and (port is None or record.get("port") == port):
            found.append((path, record))
    return found


def still_ours(record: dict[str, Any]) -> bool:
    """True when the recorded pid runs and is the very process recorded (same start time)."""
    pid, started = record.get("pid"), record.get("pid_started")
    if not isinstance(pid, int):
        return False
    now = start_time(pid)
    return now is not None and (not isinstance(started, int | float) or abs(now - started) < 1.0)


def stop_background(port: int | None = None, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Stop servers recorded in pid files (all, or the one on `port`); return their records.

    A pid file whose process is gone, or whose pid now belongs to another process (start time
    differs), is removed without signalling anything; its record says `stale: true`.
    """
    stopped = []
    for path, record in read_pid_files(port):
        if still_ours(record):
            stop_tree(record["pid"], pgid=int(record.get("pgid", record["pid"])),
                      grace_s=timeout_s)
            record["stale"] = False
        else:
            record["stale"] = True
        path.unlink(missing_ok=True)
        if record.get("cgroup"):  # a server under REPLICA_CPU_QUOTA: its cgroup goes with it
            remove_cgroup(Path(record["cgroup"]))
        stopped.append(record)
    return stopped


def recorded_shares(urls: Sequence[str]) -> list[dict[str, Any]]:
    """Each server's URL and the share its pid file records (`host_share`, None for a server
    elsewhere or one started before shares were recorded): what the bench's manifest keeps."""
    found = []
    for url in urls:
        parts = urlsplit(url)
        share = None
        if parts.hostname in ("127.0.0.1", "localhost", "0.0.0.0") and parts.port:
            for _, record in read_pid_files(parts.port):
                if still_ours(record) and "host_share" in record:
                    share = record["host_share"]
        found.append({"url": f"{parts.scheme}://{parts.netloc}", "host_share": share})
    return found
