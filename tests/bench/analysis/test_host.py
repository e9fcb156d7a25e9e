"""The host-contention verdict (issue 30): synthetic host.jsonl built to give each verdict, and
the own-CPU accounting of the sampler, whose children may end between two samples."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.analysis.host import (
    CONTENDED,
    FOREIGN_CORES_LIMIT,
    QUIET,
    UNKNOWN,
    contended_line,
    host_points,
    host_verdict,
    read_host,
)
from compaction_bench.bench.run.hostwatch import HostSampler, _Proc, local_ports, own_delta
from compaction_bench.common.files import read_jsonl


def series(foreign: float, *, own: float = 1.0, cpus: int = 2, seconds: int = 10,
           steal: float | None = 0.0, start: float = 0.0) -> list[dict[str, Any]]:
    """host.jsonl lines, one a second, where other processes use `foreign` cores, the run's
    own `own` cores and the hypervisor steals `steal` cores."""
    return [{"schema": 2, "t_s": start + t, "n_cpus": cpus, "busy_s": 100 + t * (foreign + own),
             "own_s": t * own, "steal_s": None if steal is None else 5 + t * steal,
             "own_processes": 3, "server_pids": [42]} for t in range(seconds + 1)]


def test_a_hog_beside_the_run_is_contended_with_its_figure() -> None:
    found = host_verdict(host_points(series(1.6)), 1.0, 9.0)
    assert found.verdict == CONTENDED and found.contended
    assert found.foreign_cores == pytest.approx(1.6) and found.own_cores == pytest.approx(1.0)
    assert found.figure() == ("other processes used 1.6 of 2 cores on average (threshold "
                              f"{FOREIGN_CORES_LIMIT:g} cores)")
    assert found.to_json()["verdict"] == CONTENDED


def test_a_machine_with_only_the_run_is_quiet() -> None:
    found = host_verdict(host_points(series(0.02)), 1.0, 9.0)
    assert found.verdict == QUIET and found.quiet and found.foreign_cores == pytest.approx(0.02)


def test_steal_alone_makes_a_block_contended_and_is_stated_as_a_share() -> None:
    found = host_verdict(host_points(series(0.0, steal=0.5)), 0.0, 10.0)
    assert found.verdict == CONTENDED and found.steal_share == pytest.approx(0.25)
    assert "steal 25% of CPU time" in found.figure()
    # a kernel without steal: no steal figure, the foreign CPU still judged
    none = host_verdict(host_points(series(0.0, steal=None)), 0.0, 10.0)
    assert none.verdict == QUIET and none.steal_cores is None and none.steal_share is None


def test_no_data_is_unknown_never_quiet() -> None:
    assert host_verdict([], 0.0, 10.0).verdict == UNKNOWN  # a run from before host sampling
    off = [{"schema": 2, "t_s": 0.0, "telemetry": "off", "reason": "psutil cannot read"}]
    assert host_verdict(host_points(off), 0.0, 10.0).verdict == UNKNOWN
    # samples elsewhere on the clock, or one only: no rate for this span
    assert host_verdict(host_points(series(2.0, start=100.0)), 0.0, 10.0).verdict == UNKNOWN
    one = host_verdict(host_points(series(2.0)[:1]), 0.0, 10.0)
    assert one.verdict == UNKNOWN and one.why and "1 host sample" in one.why
    # samples covering under half the span (the sampler stopped early)
    short = host_verdict(host_points(series(2.0, seconds=3)), 0.0, 10.0)
    assert short.verdict == UNKNOWN and short.why and "3.0 of 10.0 s" in short.why


def test_only_the_overlap_of_an_interval_counts() -> None:
    """A hog from t=5 on: a block over [1, 4] is quiet, one over [5, 9] contended, and one
    straddling its start gets the time-weighted average."""
    lines = series(0.0)
    for line in lines:
        t = line["t_s"]
        line["busy_s"] += max(0.0, t - 5) * 2.0
    points = host_points(lines)
    assert host_verdict(points, 1.0, 4.0).verdict == QUIET
    late = host_verdict(points, 5.0, 9.0)
    assert late.verdict == CONTENDED and late.foreign_cores == pytest.approx(2.0)
    assert host_verdict(points, 3.0, 7.0).foreign_cores == pytest.approx(1.0)


def test_the_report_line_counts_contended_blocks() -> None:
    points = host_points(series(1.6))
    quiet = host_points(series(0.0))
    verdicts = [host_verdict(points, 0, 10), host_verdict(quiet, 0, 10),
                host_verdict(quiet, 0, 10), host_verdict([], 0, 10)]
    line = contended_line(verdicts)
    assert line is not None and line.startswith("Host: 1 of 4 blocks contended (worst: other "
                                                "processes used 1.6 of 2 cores")
    assert line.endswith("; 1 unknown.")
    assert contended_line(verdicts[1:3]) == "Host: 2 of 2 blocks quiet."
    assert contended_line([host_verdict([], 0, 1)]) is None  # nothing known: no line


def test_own_cpu_counts_a_child_that_ended_between_samples_once() -> None:
    """The bench (pid 1) ran a child (pid 2) that used 1 s before the first sample's... after
    it, 0.5 s more, then was reaped: the parent's reaped-children time rises by the child's
    whole 1.5 s, of which 1.0 s was counted already."""
    before = {(1, 0.0): _Proc(10.0, 0.0, 0), (2, 50.0): _Proc(1.0, 0.0, 1)}
    after = {(1, 0.0): _Proc(10.2, 1.5, 0)}
    assert own_delta(before, after, prev_wall=100.0) == pytest.approx(0.2 + 0.5)
    # a process started since the earlier sample counts whole; one found late (a server
    # started before the run) counts from now on
    fresh = {**before, (3, 100.5): _Proc(0.3, 0.0, 1), (4, 10.0): _Proc(99.0, 0.0, 0)}
    assert own_delta(before, fresh, prev_wall=100.0) == pytest.approx(0.3)


def test_only_this_hosts_urls_are_the_runs_own_servers() -> None:
    assert local_ports(["http://127.0.0.1:8000", "http://localhost:8001/v1", None,
                        "http://gpu-box.example:9000"]) == (8000, 8001)


def test_the_sampler_writes_the_run_clock_and_counts_this_process(tmp_path: Path) -> None:
    path = tmp_path / "host.jsonl"
    origin = time.monotonic()
    with HostSampler(path, origin=origin, interval_s=0.1) as sampler:
        assert sampler.enabled and sampler.own_pids()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # this thread's busy loop is the run's own CPU
            pass
    rows = read_jsonl(path).objects
    assert len(rows) >= 3 and rows[0]["t_s"] >= 0 and rows[0]["own_s"] == 0
    assert rows[-1]["own_s"] > 0.2 and rows[-1]["n_cpus"] >= 1
    assert rows[-1]["busy_s"] - rows[0]["busy_s"] >= rows[-1]["own_s"] * 0.5
    assert len(read_host(tmp_path)) == len(rows)


def test_a_resumed_runs_fresh_counters_make_no_interval_with_the_earlier_ones() -> None:
    """A resumed run's sampler starts own_s at 0 on the same run clock: the stretch between the
    two invocations is no interval (it would read as a huge foreign figure)."""
    earlier = series(0.0, seconds=5)
    later = series(0.0, start=20.0, seconds=5)
    later[0]["first"] = True
    for line in later:
        line["busy_s"] += 5000.0  # the host's counters ran on; the own ones restarted
    points = host_points(earlier + later)
    assert host_verdict(points, 21.0, 24.0).verdict == QUIET
    assert host_verdict(points, 6.0, 19.0).verdict == UNKNOWN  # the gap: no interval
