"""A server of the suite's fake engine (`fake-faults`, through the real launcher) under a share
of the host (REPLICA_CPUS, REPLICA_CPU_QUOTA): the process really runs on its CPU set and in its
cgroup with its quota (cgroup v2's cpu.max, or cgroup v1's cpu.cfs_quota_us where v2 has no cpu
controller, as on this project's machines), the quota really throttles a busy process in that
cgroup, its pid file records the share the bench's manifest reads, and the cgroup is gone once
it stopped (`Server.stop` and `make stop` alike). Where no cpu controller is mounted at all, the
quota is refused in one line and nothing is started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.manifest import replica_shares
from compaction_bench.common.net import free_port
from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.launcher import Server, ServerConfig
from compaction_bench.serve.process import pid_file, stop_background
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import server_config
from compaction_bench.serve.share import HostShare, cgroup_base, cgroup_mount, cgroup_prefix

pytestmark = pytest.mark.e2e


def _cpu_controller() -> bool:
    """A cpu controller is mounted here, cgroup v2's or a v1 hierarchy, and this process may
    make cgroups (read only: nothing is made at collection)."""
    return cgroup_base() is not None and os.geteuid() == 0


def _version() -> str:
    return "v2" if cgroup_base() == cgroup_mount() else "v1"


def _server(share: HostShare) -> Server:
    last = max(os.sched_getaffinity(0))  # not CPU 0: a pinned set differs from the default
    base = ServerConfig(profile=load_profile("fake-faults"), port=free_port(),
                        ready_timeout_s=60.0)
    return Server(server_config(base, share, cpus=(last,) if share.cpus else None))


def test_a_server_runs_on_its_cpu_set_and_records_it() -> None:
    server = _server(HostShare(cpus=1))
    with server:
        assert server.process is not None
        cpus = list(server.config.cpus)
        assert cpus == [max(os.sched_getaffinity(0))]
        assert psutil.Process(server.process.pid).cpu_affinity() == cpus
        record = json.loads(pid_file(server.config.port).read_text())
        assert record["host_share"] == {"cpus": cpus, "pinned": True, "cpu_quota": None,
                                        "host_cpus": os.cpu_count(), "cgroup": None}
        # what the bench's manifest keeps for a run on this one server
        shares = replica_shares(BenchConfig(port=server.config.port), server.api_url)
        assert shares == [{"url": server.server_url, "host_share": record["host_share"]}]
    assert not pid_file(server.config.port).exists()


def _throttled(cgroup: Path) -> int:
    """Periods in which the cgroup's quota ran out (cpu.stat, under cgroup v1 and v2 alike)."""
    stat = dict(line.split()[:2] for line in (cgroup / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


def _busy_share(cgroup: Path, busy: subprocess.Popen[bytes]) -> tuple[float, int]:
    """A busy loop's CPU-seconds per wall second in `cgroup`, and the periods it was throttled,
    over at least 2 s and until the quota has bitten (30 s at most: on a loaded machine the
    loop may not reach its quota in every period)."""
    time.sleep(0.5)  # the interpreter's start-up, in the cgroup already
    process = psutil.Process(busy.pid)
    cpu0, wall0, throttled0 = sum(process.cpu_times()[:2]), time.monotonic(), _throttled(cgroup)
    while True:
        time.sleep(0.5)
        wall = time.monotonic() - wall0
        if (wall >= 2.0 and _throttled(cgroup) > throttled0) or wall > 30.0:
            break
    return (sum(process.cpu_times()[:2]) - cpu0) / wall, _throttled(cgroup) - throttled0


@pytest.mark.skipif(not _cpu_controller(), reason="no cgroup cpu controller here (or not root)")
def test_a_server_runs_in_its_cgroup_under_its_quota_and_the_cgroup_goes_with_it() -> None:
    server = _server(HostShare(cpus=1, cpu_quota=0.5))
    busy: subprocess.Popen[bytes] | None = None
    try:
        with server:
            assert server.process is not None and server.cgroup is not None
            cgroup, port = server.cgroup, server.config.port
            base = cgroup_base()
            assert base is not None and cgroup == base / "compaction-bench" / str(port)
            if _version() == "v2":
                assert (cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
            else:
                assert (cgroup / "cpu.cfs_period_us").read_text().strip() == "100000"
                assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert server.process.pid in map(int, (cgroup / "cgroup.procs").read_text().split())
            # /proc/<pid>/cgroup: "0::/compaction-bench/<port>" (v2), "4:cpu:/compaction-..." (v1)
            lines = Path(f"/proc/{server.process.pid}/cgroup").read_text().splitlines()
            hierarchy = [line for line in lines if (line.split(":")[1] == "" if _version() == "v2"
                         else "cpu" in line.split(":")[1].split(","))]
            assert hierarchy and hierarchy[0].endswith(f":/compaction-bench/{port}"), lines
            record = json.loads(pid_file(port).read_text())
            assert record["host_share"]["cpu_quota"] == 0.5 and record["cgroup"] == str(cgroup)
            assert record["host_share"]["cgroup"] == f"{_version()}:{cgroup}"
            # the quota bites: a busy loop beside the server, in its cgroup, gets about half a
            # CPU; asserted loosely (throttled at all, well under one CPU) for a loaded machine
            busy = subprocess.Popen([*cgroup_prefix(cgroup), sys.executable, "-c",
                                     "while True: pass"])
            rate, throttled = _busy_share(cgroup, busy)
            assert busy.pid in map(int, (cgroup / "cgroup.procs").read_text().split())
            assert throttled > 0 and rate < 0.8, (rate, throttled)
        # stopping the server removed its cgroup, killing what still ran in it (the busy loop)
        assert not cgroup.exists()
        assert busy.wait(timeout=15) != 0
    finally:
        if busy is not None and busy.poll() is None:
            busy.kill()
            busy.wait()


@pytest.mark.skipif(not _cpu_controller(), reason="no cgroup cpu controller here (or not root)")
def test_make_stop_removes_the_cgroup_of_a_server_started_elsewhere() -> None:
    server = _server(HostShare(cpu_quota=0.5))
    server.start()
    try:
        server.wait_ready()
        cgroup = server.cgroup
        assert cgroup is not None and cgroup.is_dir()
        [record] = stop_background(server.config.port)  # what `make stop PORT=...` runs
        assert record["cgroup"] == str(cgroup) and not record["stale"]
        assert not cgroup.exists() and not pid_file(server.config.port).exists()
    finally:
        server.stop()


@pytest.mark.skipif(_cpu_controller(), reason="a cgroup cpu controller is mounted here")
def test_a_quota_without_a_cpu_controller_is_refused_and_nothing_starts() -> None:
    server = _server(HostShare(cpu_quota=0.5))
    with pytest.raises(EngineUnavailableError, match=r"^REPLICA_CPU_QUOTA needs a cgroup cpu "
                       r"controller.*REPLICA_CPUS=n") as refused:
        server.start()
    assert "\n" not in str(refused.value)
    assert server.process is None and not pid_file(server.config.port).exists()


def test_the_cgroup_prefix_enters_before_it_execs_the_server_in_its_place(
        tmp_path: Path) -> None:
    """The wrapper's mechanics on a stand-in folder (a plain cgroup.procs file): it writes 0
    (move the writer itself) and then execs the command, which keeps the pid the wrapper had,
    so the server and all it starts are in the cgroup from their first instruction."""
    import subprocess
    import sys

    done = subprocess.run([*cgroup_prefix(tmp_path), sys.executable, "-c",
                           "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert (tmp_path / "cgroup.procs").read_text() == "0\n"
    assert done.stdout.strip().isdigit()
    shell = subprocess.Popen([*cgroup_prefix(tmp_path), sys.executable, "-c",
                              "import os, sys; sys.stdout.write(str(os.getpid()))"],
                             stdout=subprocess.PIPE, text=True)
    out, _ = shell.communicate(timeout=60)
    assert out == str(shell.pid)  # exec'd in the wrapper's place
