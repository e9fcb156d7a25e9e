"""The fault harness: real bench processes against the suite's fake engine, a fault injected
while they run, and what survived measured from the run folder and the process table.

A row's verdict has three parts, the columns of `make faults`:
- survived: the bench ended the way the row expects (finished, or stopped with one clear line
  and the `RESUME` hint), printed no traceback, and left no process behind;
- finished records lost: every complete record line in the run folder when the fault struck
  (`snapshot`) must still be there, readable, afterwards (`lost`); a row that resumes checks
  after the resume;
- the one line the user saw (`user_line`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from compaction_bench.common.net import free_port
from compaction_bench.common.paths import repo_root
from compaction_bench.common.processtree import stop_tree
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

RECORD_FILES = ("arms.jsonl", "blocks.jsonl", "requests.jsonl")
TRACEBACK = "Traceback (most recent call last)"
# The canary a hostile agent must never see: set in the bench's own environment.
SECRET_NAME, SECRET_VALUE = "COMPRESSOR_API_KEY", "sk-canary-0123456789abcdef0123456789abcdef"
# The fake engine's default reply: one harmless command, so arms keep stepping until the limit.
AGENT_REPLY = ("THOUGHT: I will list the files of this repository to find the module that holds "
               "the median function.\n\n```bash\nls\n```")


@dataclass(frozen=True)
class FaultResult:
    fault: str
    survived: bool
    lost: int | None  # finished records lost (None: the row could not count them)
    line: str  # the one line the user saw
    why: str = ""  # what did not hold, when not survived

    def to_json(self) -> dict[str, Any]:
        return {"fault": self.fault, "survived": self.survived, "records_lost": self.lost,
                "line": self.line, "why": self.why}


@dataclass
class Context:
    """One row's own folders and environment (results, pid files, histories untouched)."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "COMPBENCH_RESULTS": str(self.results),
                    "COMPBENCH_RUN_DIR": str(self.root / "run"), "PYTHONUNBUFFERED": "1",
                    SECRET_NAME: SECRET_VALUE, **self.env}

    @property
    def results(self) -> Path:
        return self.root / "results"

    def run_dir(self, run_id: str) -> Path:
        return self.results / run_id


def bench_argv(*args: str, port: int | None = None, base_url: str | None = None) -> list[str]:
    """`compaction-bench bench` on the fake engine (no self-check: it has no
    model)."""
    argv = [sys.executable, "-m", "compaction_bench", "bench", "profile=fake-faults",
            "selfcheck=0", "source=agent"]
    if port is not None:
        argv += [f"port={port}"]
    if base_url is not None:
        argv += [f"base_url={base_url}"]
    return argv + list(args)


def make_argv(**variables: str) -> list[str]:
    """`make bench` with variables, as a user types it."""
    return ["make", "--no-print-directory", "-C", str(repo_root()), "bench",
            "PROFILE=fake-faults", "SELFCHECK=0", "SOURCE=agent",
            *(f"{k}={v}" for k, v in variables.items())]


def _default_sigint() -> None:
    # a background job of a non-interactive shell starts with SIGINT ignored, and Python then
    # never installs its Ctrl-C handler: reset it, as a terminal's foreground job has it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class BenchProcess:
    """A bench (or `make bench`) in a session of its own, its output collected as it comes."""

    def __init__(self, argv: list[str], ctx: Context) -> None:
        self.argv = argv
        self.process = subprocess.Popen(
            argv, cwd=repo_root(), env=ctx.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
            preexec_fn=_default_sigint)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        self.process.stdout.close()  # at its end: no pipe left for the garbage collector
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, text: str, timeout_s: float = 120.0) -> bool:
        """Wait until a line containing `text` appears (False: the process ended first)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not any(text in line for line in self.lines):
                if self.process.poll() is not None and not self._reader.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def signal(self, sig: int, *, group: bool) -> None:
        """`group`: to the whole process group, as a terminal does; else to the process."""
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.process.pid, sig)
            else:
                self.process.send_signal(sig)

    def wait(self, timeout_s: float = 300.0) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # the harness's own limit, not a fault: the bench and all it started go at once
            stop_tree(self.process, grace_s=0)
            code = self.process.wait()
            self.lines.append(f"[harness] killed after {timeout_s:g} s")
        self._reader.join(timeout=10)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def run_bench_process(argv: list[str], ctx: Context, timeout_s: float = 300.0
                      ) -> tuple[int, str]:
    bench = BenchProcess(argv, ctx)
    return bench.wait(timeout_s), bench.output


def user_line(output: str) -> str:
    """The line a user reads: the first `error:` line, else the last non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors[0] if errors else lines[-1] if lines else "(no output)")[:300]


def snapshot(run_dir: Path) -> dict[str, list[str]]:
    """The complete record lines of the run folder now (a torn last line is not a record)."""
    out: dict[str, list[str]] = {}
    for name in RECORD_FILES:
        path = run_dir / name
        if not path.is_file():
            out[name] = []
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        lines = text.split("\n")[:-1]  # the part after the last newline is not complete
        out[name] = [line for line in lines if line.strip() and _json(line)]
    return out


def _json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def lost(before: dict[str, list[str]], run_dir: Path) -> int:
    """Records complete in `before` that are not in the run folder now."""
    now = snapshot(run_dir)
    missing = 0
    for name, lines in before.items():
        have = Counter(now.get(name, []))
        for line in lines:
            if have[line] > 0:
                have[line] -= 1
            else:
                missing += 1
    return missing


def leftovers(*markers: str) -> list[str]:
    """Live processes (zombies excluded) whose command line holds any marker."""
    found = []
    me = os.getpid()
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if process.info["pid"] == me or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(m in cmdline for m in markers) and "pytest" not in cmdline:
            found.append(f"{process.info['pid']} {cmdline[:120]}")
    return found


def settle_leftovers(*markers: str, timeout_s: float = 10.0) -> list[str]:
    """Leftovers after giving exiting processes a moment (a stopped group dies in order)."""
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(*markers)) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


def records_when(run_dir: Path, ready: Callable[[dict[str, list[str]]], bool],
                 timeout_s: float = 120.0) -> dict[str, list[str]] | None:
    """Poll the run folder until `ready(snapshot)`; that snapshot, or None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run_dir.is_dir():
            now = snapshot(run_dir)
            if ready(now):
                return now
        time.sleep(0.2)
    return None


@contextlib.contextmanager
def fake_engine(**config: Any) -> Iterator[FakeProcess]:
    """A fake engine of the row's own (known timing, scripted replies), on a free port."""
    settings = {"ttft_ms": 5, "itl_ms": 1, "default_content": AGENT_REPLY, **config}
    with FakeProcess(FakeConfig(port=free_port(), **settings)) as fake:
        yield fake


def traceback_tail(output: str, frames: int = 2) -> str:
    """The last traceback in `output` on one line: its last frames and the exception, so that
    a failed row says what raised and where, not only that something did."""
    start = output.rindex(TRACEBACK)
    before = output[:start].rstrip("\n").rpartition("\n")[2].strip()
    # an exception Python could not raise (in a finalizer, a weakref callback) says so above
    head = [before] if before.startswith("Exception ignored") else []
    body: list[str] = []
    for line in output[start:].splitlines()[1:]:
        body.append(line.strip())
        if line and not line[0].isspace():  # the exception line closes the traceback
            break
    return " | ".join(head + body[-(2 * frames + 1):])


def verdict(fault: str, output: str, *, expect: list[tuple[bool, str]], lost_count: int | None,
            markers: tuple[str, ...] = ()) -> FaultResult:
    """Survived when every expectation holds, no traceback was printed and no process with a
    marker is left; `why` lists what did not hold."""
    why = [text for ok, text in expect if not ok]
    if TRACEBACK in output:
        why.append(f"a traceback was printed, ending: {traceback_tail(output)}")
    if markers and (left := settle_leftovers(*markers)):
        why.append(f"processes left: {'; '.join(left)}")
    if lost_count:
        why.append(f"{lost_count} finished record(s) lost")
    return FaultResult(fault, survived=not why, lost=lost_count, line=user_line(output),
                       why="; ".join(why))
