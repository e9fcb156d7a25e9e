"""The rows of `make faults`: one fault each, injected into a real bench process.

Every row runs the bench on the suite's fake engine (known timing, scripted replies, no model)
in a folder of its own, injects its fault while the bench runs, and returns its verdict
(`bench.faults.harness.verdict`). The rows are also the tests (tests/bench/faults).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from compaction_bench.bench.analysis.load import BACKGROUND
from compaction_bench.bench.faults.harness import (
    BenchProcess,
    Context,
    FaultResult,
    bench_argv,
    fake_engine,
    lost,
    make_argv,
    records_when,
    run_bench_process,
    snapshot,
    verdict,
)
from compaction_bench.bench.runfolder import RunRecords, read_run
from compaction_bench.common.net import free_port
from compaction_bench.loadgen.fakeprocess import FakeProcess

STEPS = "6"  # postfork model calls per arm: a block lasts a few seconds on the fake engine
LONG_STEPS = "24"  # where the fault must strike inside the block
BACKGROUND_TTFT_MS = 60  # background rows: 24 arm steps of >= 60 ms keep block 1 open seconds


@dataclass(frozen=True)
class Row:
    """One fault. `exclusive` rows look at every process on the machine (the hostile agent's
    leftovers by uid), so they run alone, after the rows that run side by side."""

    name: str
    run: Callable[[Context], list[FaultResult]]
    exclusive: bool = False


def _arm_errors(run_dir: Path) -> dict[str, str]:
    folder = read_run(run_dir)
    return {f"{r.block}/{r.arm}": r.error or "" for r in folder.arms}


def _closed_blocks(run_dir: Path) -> set[int]:
    return {b.block for b in read_run(run_dir).blocks}


def _requests_by(source: str, count: int) -> Callable[[dict[str, list[str]]], bool]:
    def ready(now: dict[str, list[str]]) -> bool:
        found = [line for line in now["requests.jsonl"]
                 if json.loads(line).get("source") == source]
        return len(found) >= count
    return ready


# --- the server and its streams ---------------------------------------------------------------

def server_killed(ctx: Context) -> list[FaultResult]:
    """The bench's own server SIGKILLed mid-block: one line with RESUME; the resumed run
    completes every block, the cut block again in full."""
    port, run = free_port(), "server-killed"
    bench = BenchProcess(bench_argv(f"run_id={run}", "arms=clean,self", "blocks=2",
                                    f"step_limit={STEPS}", port=port), ctx)
    before = records_when(ctx.run_dir(run), _requests_by("clean", 2)) or {}
    killed = False
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "compaction_bench.loadgen.fakeserver" in cmdline and f"--port {port}" in cmdline:
            os.killpg(process.info["pid"], signal.SIGKILL)  # the launcher's process group
            killed = True
    code = bench.wait()
    first = bench.output
    code2, _ = run_bench_process(bench_argv(f"resume={run}", port=port), ctx)
    blocks = _closed_blocks(ctx.run_dir(run))
    return [verdict("server killed mid-block", first, expect=[
        (killed, "the bench's server process was not found"),
        (code == 1, f"exit code {code}, expected 1"),
        ("stopped answering" in first and f"RESUME={run}" in first, "no RESUME hint"),
        (code2 == 0, f"the resumed run exited {code2}"),
        (blocks == {1, 2}, f"blocks closed after the resume: {sorted(blocks)}")],
        lost_count=lost(before, ctx.run_dir(run)), markers=(f"--port {port}",))]


def _scripted_run(ctx: Context, run: str, script: list[dict[str, object]], arms: str,
                  *extra: str) -> tuple[int, str, float, dict[str, str]]:
    with fake_engine() as fake:
        fake.script(script)
        started = time.monotonic()
        code, output = run_bench_process(bench_argv(
            f"run_id={run}", f"arms={arms}", "blocks=1", f"step_limit={STEPS}", *extra,
            base_url=fake.server_url), ctx)
        took = time.monotonic() - started
    return code, output, took, _arm_errors(ctx.run_dir(run))


def _arm_line(errors: dict[str, str], output: str) -> str:
    failed = [f"arm {k} failed: {v}" for k, v in errors.items() if v]
    return failed[0][:300] if failed else output


def stalled_target(ctx: Context) -> list[FaultResult]:
    """A target stream that stops after one token and stays open for 60 s, under a 2 s
    stream deadline: the arm fails with that reason, the run goes on and ends."""
    code, output, took, errors = _scripted_run(
        ctx, "stalled-target", [{"match": {"model": "target"}, "stall_after_tokens": 1,
                                 "stall_s": 60}], "clean", "stream_deadline_s=2")
    error = errors.get("1/clean", "")
    result = verdict("target stream stalls past its deadline", output, expect=[
        (code == 0, f"exit code {code}"),
        ("longest silence 2" in error, f"the arm's error does not name the deadline: {error!r}"),
        (took < 45, f"the run took {took:.0f} s: the stall was waited out")], lost_count=0)
    return [FaultResult(result.fault, result.survived, result.lost,
                        _arm_line(errors, result.line), result.why)]


def stalled_compressor(ctx: Context) -> list[FaultResult]:
    """Every compressor stream stalls, under a 2 s compressor deadline: the self arm fails its
    protocol check (its policy could not apply), clean completes, the run ends."""
    code, output, took, errors = _scripted_run(
        ctx, "stalled-compressor", [{"match": {"model": "compressor"}, "stall_after_tokens": 1,
                                     "stall_s": 60, "repeat": 1000}], "clean,self",
        "compressor_deadline_s=2")
    result = verdict("stalled compressor", output, expect=[
        (code == 0, f"exit code {code}"),
        (errors.get("1/self", "").startswith("PolicyError"),
         f"self did not fail as not applied: {errors.get('1/self')!r}"),
        (errors.get("1/clean") == "", f"clean failed: {errors.get('1/clean')!r}"),
        (took < 60, f"the run took {took:.0f} s")], lost_count=0)
    return [FaultResult(result.fault, result.survived, result.lost,
                        _arm_line(errors, result.line), result.why)]


def http_burst(status: int) -> Callable[[Context], list[FaultResult]]:
    def row(ctx: Context) -> list[FaultResult]:
        code, output, _, errors = _scripted_run(
            ctx, f"http-{status}", [{"match": {"model": "target"}, "status": status,
                                     "repeat": 4}], "clean,self")
        requests = read_run(ctx.run_dir(f"http-{status}")).requests
        hit = [r for r in requests if r.http_status == status]
        result = verdict(f"burst of HTTP {status}", output, expect=[
            (code == 0, f"exit code {code}"),
            (len(hit) >= 2, f"{len(hit)} requests recorded with HTTP {status}"),
            (any(f"HTTP {status}" in e for e in errors.values()),
             f"no arm records the HTTP {status}: {errors}")], lost_count=0)
        return [FaultResult(result.fault, result.survived, result.lost,
                            _arm_line(errors, result.line), result.why)]
    return row


def compressor_down(ctx: Context) -> list[FaultResult]:
    """The external compressor's server dies after the run started: the external arm fails
    as not applied, clean completes, the run ends."""
    run = "compressor-down"
    with fake_engine() as target, fake_engine() as external:
        bench = BenchProcess(bench_argv(
            f"run_id={run}", "arms=clean,external", "blocks=1", f"step_limit={STEPS}",
            f"external_url={external.server_url}", base_url=target.server_url), ctx)
        started = bench.wait_for("[bench] run")
        external.stop()
        code = bench.wait()
    errors = _arm_errors(ctx.run_dir(run))
    result = verdict("compressor down", bench.output, expect=[
        (started, "the run did not start"), (code == 0, f"exit code {code}"),
        (errors.get("1/external", "").startswith("PolicyError"),
         f"external did not fail as not applied: {errors.get('1/external')!r}"),
        (errors.get("1/clean") == "", f"clean failed: {errors.get('1/clean')!r}")],
        lost_count=0)
    return [FaultResult(result.fault, result.survived, result.lost,
                        _arm_line(errors, result.line), result.why)]


def malformed_sse(ctx: Context) -> list[FaultResult]:
    """Events `data: 1`, `data: [1]`, `{"choices": [1]}`: each request fails with the event
    named, never a traceback; the run ends."""
    script: list[dict[str, object]] = [{"match": {"model": "target"}, "events": [e]}
                                       for e in ("1", "[1]", '{"choices":[1]}')]
    code, output, _, _ = _scripted_run(ctx, "malformed-sse", script, "clean,self")
    requests = read_run(ctx.run_dir("malformed-sse")).requests
    named = [r for r in requests if "malformed stream event" in (r.error or "")]
    result = verdict("malformed SSE events", output, expect=[
        (code == 0, f"exit code {code}"),
        (len(named) >= 2, f"{len(named)} requests recorded as malformed")], lost_count=0)
    return [FaultResult(result.fault, result.survived, result.lost,
                        (named[0].error or "")[:300] if named else result.line, result.why)]


# --- the background load -------------------------------------------------------------------

def _locust(ctx: Context) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "compaction_bench.loadgen.locust_main" in cmdline and str(ctx.root) in cmdline:
            found.append(process)
    return found


def background_fault(name: str, inject: Callable[[Context, FakeProcess], None]
                     ) -> Callable[[Context], list[FaultResult]]:
    """Shared regime (2 background users) on the fake engine; the fault strikes during block
    1: the block is marked invalid, the run stops at its end with one line and the RESUME
    hint, and the resumed run (a fresh background) completes.

    The block the fault struck is read from the records (the first failed background
    request's send time inside a block's span), not assumed: under a loaded CI machine block 1
    could close before the injection landed, and the row then failed for the harness's race
    rather than the bench's fault (CI, 2026-12: "block 1 is not marked invalid (invalid:
    [2])"). Each arm step waits `BACKGROUND_TTFT_MS`, so block 1 lasts seconds past the
    injection and the fault does strike there; the row says so where it did not."""
    def row(ctx: Context) -> list[FaultResult]:
        run = name.replace(" ", "-")
        with fake_engine(ttft_ms=BACKGROUND_TTFT_MS) as fake:
            bench = BenchProcess(bench_argv(
                f"run_id={run}", "regime=shared", "arms=clean,self", "blocks=2",
                f"step_limit={LONG_STEPS}", base_url=fake.server_url), ctx)
            before = records_when(ctx.run_dir(run), _requests_by("clean", 1)) or {}
            inject(ctx, fake)
            code = bench.wait()
            first = bench.output
            stopped = read_run(ctx.run_dir(run))  # the first run's records, before the resume
            fake.reset()  # the fault's script is spent or cleared: the resume has a clean server
            code2, _ = run_bench_process(bench_argv(f"resume={run}",
                                                    base_url=fake.server_url), ctx)
        folder = read_run(ctx.run_dir(run))
        invalid = {b.block for b in folder.blocks if b.invalid_reasons}
        struck = _struck_block(stopped)
        return [verdict(name, first, expect=[
            (code == 1, f"exit code {code}, expected 1"),
            ("background" in first and f"RESUME={run}" in first, "no background line + RESUME"),
            (struck is not None, "no failed background request was sent inside a block"),
            (struck == 1, f"the fault struck block {struck}, not block 1 (the harness's "
                          "injection came late: raise BACKGROUND_TTFT_MS)"),
            (struck in invalid, f"block {struck}, where the fault struck, is not marked "
                                f"invalid (invalid: {sorted(invalid)})"),
            (max((b.block for b in stopped.blocks), default=None) == struck,
             f"the first run did not stop at the end of block {struck}"),
            (code2 == 0, f"the resumed run exited {code2}"),
            ({b.block for b in folder.blocks} == {1, 2}, "not every block closed")],
            lost_count=lost(before, ctx.run_dir(run)),
            markers=(str(ctx.root),))]
    return row


def _struck_block(folder: RunRecords) -> int | None:
    """The block whose span holds the fault's first sign: the send time of the first
    background request that failed, or the first load sample with the load not running,
    whichever came first."""
    signs = [r.sent_s for r in folder.requests if r.source == BACKGROUND and r.status != "ok"]
    signs += [s.t_s for s in folder.load if not s.running]
    for when in sorted(signs)[:1]:
        for block in folder.blocks:
            if (block.started_s is not None and block.ended_s is not None
                    and block.started_s <= when <= block.ended_s):
                return block.block
    return None


def _kill_locust(ctx: Context, fake: FakeProcess) -> None:
    for process in _locust(ctx):
        process.kill()


def _stop_locust(ctx: Context, fake: FakeProcess) -> None:
    # a graceful end of the load on its own, as when a run time expires
    for process in _locust(ctx):
        if "--worker" not in " ".join(process.cmdline()):
            process.terminate()


def _refuse_background(ctx: Context, fake: FakeProcess) -> None:
    fake.script([{"match": {"request_id_prefix": "bg-"}, "status": 401, "repeat": 100000}])


# --- records -----------------------------------------------------------------------------------

def torn_line(ctx: Context) -> list[FaultResult]:
    """A crash cut the last line of arms.jsonl: RESUME reports it, starts on a fresh line,
    keeps every complete record, and completes."""
    run = "torn-line"
    with fake_engine() as fake:
        code1, _ = run_bench_process(bench_argv(f"run_id={run}", "arms=clean,self",
                                                "blocks=1", f"step_limit={STEPS}",
                                                base_url=fake.server_url), ctx)
        arms = ctx.run_dir(run) / "arms.jsonl"
        before = snapshot(ctx.run_dir(run))
        with arms.open("a") as f:
            f.write('{"schema": 2, "regime": "dedicated", "block": 2, "arm": "cle')
        code2, output = run_bench_process(bench_argv(f"resume={run}", "blocks=2",
                                                     base_url=fake.server_url), ctx)
    folder = read_run(ctx.run_dir(run))
    torn_reported = any("cut short" in i.reason for i in folder.issues)
    result = verdict("torn last JSONL line, then RESUME", output, expect=[
        (code1 == 0, f"the first run exited {code1}"), (code2 == 0, f"resume exited {code2}"),
        ({b.block for b in folder.blocks} == {1, 2}, "not every block closed"),
        (len([r for r in folder.arms if r.block == 2]) == 2, "block 2 lacks its records"),
        (torn_reported, f"the torn line is not reported: {folder.issues}")],
        lost_count=lost(before, ctx.run_dir(run)))
    said = [line for line in output.splitlines() if "cut short" in line]
    return [FaultResult(result.fault, result.survived and bool(said), result.lost,
                        said[0] if said else result.line,
                        result.why or ("" if said else "the resume did not say so"))]


def full_disk(ctx: Context) -> list[FaultResult]:
    """The results folder on a 40 KiB tmpfs (bubblewrap): the bench stops with one line when a
    record no longer fits; every record written before is kept, and RESUME on a disk with
    room completes the run."""
    from compaction_bench.histories.agent.sandbox import bwrap_command

    run, small, saved = "full-disk", ctx.root / "small", ctx.root / "saved"
    saved.mkdir(parents=True, exist_ok=True)
    with fake_engine() as fake:
        argv = bench_argv(f"run_id={run}", "arms=clean,self", "blocks=3",
                          f"step_limit={STEPS}", base_url=fake.server_url)
        script = (" ".join(f"'{a}'" for a in argv) + f"; rc=$?; cp -a {small}/. {saved}/; "
                  "exit $rc")
        wrapped = bwrap_command(["--dev-bind", "/", "/", "--size", str(40 * 1024), "--tmpfs",
                                 str(small), "--", "/bin/sh", "-c", script])
        small_ctx = Context(ctx.root, env={"COMPBENCH_RESULTS": str(small)})
        small_ctx.env.update(wrapped[1])
        bench = BenchProcess(wrapped[0], small_ctx)
        code = bench.wait()
        before = snapshot(saved / run)
        big = Context(ctx.root, env={"COMPBENCH_RESULTS": str(saved)})
        code2, _ = run_bench_process(bench_argv(f"resume={run}", base_url=fake.server_url),
                                     big)
    folder = read_run(saved / run) if (saved / run).is_dir() else None
    blocks = {b.block for b in folder.blocks} if folder else set()
    return [verdict("full disk during a block", bench.output, expect=[
        (code == 1, f"exit code {code}, expected 1"),
        ("No space left" in bench.output and f"RESUME={run}" in bench.output,
         "no disk-full line with RESUME"),
        (code2 == 0, f"the resumed run exited {code2}"),
        (blocks == {1, 2, 3}, f"blocks closed after the resume: {sorted(blocks)}")],
        lost_count=lost(before, saved / run))]


# --- signals -------------------------------------------------------------------------------------

def signal_row(name: str, sig: int, *, times: int = 1, group: bool = True
               ) -> Callable[[Context], list[FaultResult]]:
    """`make bench` (shared regime: locust and the bench's own server run) gets `sig` in a
    block, as a terminal (the process group) or `kill` (make alone) sends it: it ends at once
    with the RESUME hint, every finished record kept, no server or locust process left."""
    def row(ctx: Context) -> list[FaultResult]:
        port = free_port()
        bench = BenchProcess(make_argv(REGIME="shared", PORT=str(port), ARMS="clean,self",
                                       BLOCKS="20", STEP_LIMIT=STEPS, RUN_ID=name), ctx)
        before = records_when(ctx.run_dir(name), _requests_by("clean", 2)) or {}
        sent = time.monotonic()
        for _ in range(times):
            bench.signal(sig, group=group)
            time.sleep(0.3)
        code = bench.wait()
        took = time.monotonic() - sent
        return [verdict(f"{'double ' if times > 1 else ''}{signal.Signals(sig).name} of "
                        "make bench", bench.output, expect=[
            (bool(before), "the run never got to its first requests"),
            (code != 0, "exit code 0 after a signal"),
            (f"RESUME={name}" in bench.output, "no RESUME hint"),
            (took < 60, f"it took {took:.0f} s to stop")],
            lost_count=lost(before, ctx.run_dir(name)),
            markers=(f"--port {port}", str(ctx.root)))]
    return row


# --- bad input -----------------------------------------------------------------------------------

def non_utf8(ctx: Context) -> list[FaultResult]:
    """Non-UTF-8 bytes in a profile, a history file and a run's manifest: each refused with
    one line naming the file; nothing is written, nothing is lost."""
    out: list[FaultResult] = []
    bad = b"\xff\xfe not text \x80\x81"
    profile = ctx.root / "bad-profile.toml"
    profile.write_bytes(b'name = "x"\n' + bad)
    code, output = run_bench_process([*bench_argv(f"profile={profile}"), "run_id=never"], ctx)
    out.append(verdict("non-UTF-8 profile", output, expect=[
        (code in (1, 2), f"exit code {code}"), (str(profile) in output, "the file is not named")],
        lost_count=0))
    histories = ctx.root / "histories"
    from compaction_bench.common.paths import histories_root

    shutil.copytree(histories_root() / "fix-median", histories / "fix-median")
    (histories / "fix-median" / "self.json").write_bytes(bad)
    bad_history = Context(ctx.root, env={"COMPBENCH_HISTORIES": str(histories)})
    code, output = run_bench_process(bench_argv("arms=clean,self", "run_id=h",
                                                f"port={free_port()}"), bad_history)
    out.append(verdict("non-UTF-8 history file", output, expect=[
        (code in (1, 2), f"exit code {code}"), ("self.json" in output, "the file is not named")],
        lost_count=0))
    with fake_engine() as fake:
        run = "bad-manifest"
        run_bench_process(bench_argv(f"run_id={run}", "arms=clean", "blocks=1",
                                     "step_limit=2", base_url=fake.server_url), ctx)
        before = snapshot(ctx.run_dir(run))
        manifest = ctx.run_dir(run) / "manifest.json"
        original = manifest.read_bytes()
        manifest.write_bytes(bad)
        code, output = run_bench_process(bench_argv(f"resume={run}",
                                                    base_url=fake.server_url), ctx)
        manifest.write_bytes(original)
    out.append(verdict("non-UTF-8 manifest on RESUME", output, expect=[
        (code in (1, 2), f"exit code {code}"), ("manifest.json" in output,
                                                "the file is not named")],
        lost_count=lost(before, ctx.run_dir(run))))
    return out


ROWS: list[Row] = [
    Row("server killed mid-block", server_killed),
    Row("target stream stalls past its deadline", stalled_target),
    Row("stalled compressor", stalled_compressor),
    Row("burst of HTTP 500", http_burst(500)),
    Row("burst of HTTP 429", http_burst(429)),
    Row("compressor down", compressor_down),
    Row("background load killed", background_fault("background load killed", _kill_locust)),
    Row("background load expired", background_fault("background load expired", _stop_locust)),
    Row("background load all-401",
        background_fault("background load all-401", _refuse_background)),
    Row("torn last JSONL line, then RESUME", torn_line),
    Row("full disk during a block", full_disk),
    Row("SIGINT of make bench", signal_row("sigint", signal.SIGINT)),
    Row("double SIGINT of make bench", signal_row("double-sigint", signal.SIGINT, times=2)),
    Row("SIGTERM of make bench", signal_row("sigterm", signal.SIGTERM, group=False)),
    Row("SIGHUP of make bench", signal_row("sighup", signal.SIGHUP)),
    Row("malformed SSE events", malformed_sse),
    Row("non-UTF-8 input files", non_utf8),
]
