"""A server of the suite's fake engine (`fake-faults`, through the real launcher) under a share
of the host (REPLICA_CPUS, REPLICA_CPU_QUOTA): the process really runs on its CPU set and in its
cgroup with its cpu.max, its pid file records the share the bench's manifest reads, and the
cgroup is gone once it stopped. Where cgroup v2 has no cpu controller (this project's machine
binds cpu to cgroup v1), the quota is refused in one line and nothing is started."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.manifest import replica_shares
from compaction_bench.common.net import free_port
from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.launcher import Server, ServerConfig
from compaction_bench.serve.process import pid_file
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import server_config
from compaction_bench.serve.share import HostShare, cgroup_mount, cgroup_prefix

pytestmark = pytest.mark.e2e


def _cpu_controller() -> bool:
    """cgroup v2 offers its cpu controller here (read only: nothing is made at collection)."""
    mount = cgroup_mount()
    controllers = mount / "cgroup.controllers" if mount is not None else None
    return (controllers is not None and controllers.is_file()
            and "cpu" in controllers.read_text().split() and os.geteuid() == 0)


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
                                        "host_cpus": os.cpu_count()}
        # what the bench's manifest keeps for a run on this one server
        shares = replica_shares(BenchConfig(port=server.config.port), server.api_url)
        assert shares == [{"url": server.server_url, "host_share": record["host_share"]}]
    assert not pid_file(server.config.port).exists()


@pytest.mark.skipif(not _cpu_controller(), reason="cgroup v2 has no cpu controller here")
def test_a_server_runs_in_its_cgroup_under_its_quota_and_the_cgroup_goes_with_it() -> None:
    server = _server(HostShare(cpus=1, cpu_quota=0.5))
    with server:
        assert server.process is not None and server.cgroup is not None
        cgroup = server.cgroup
        assert (cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
        assert server.process.pid in map(int, (cgroup / "cgroup.procs").read_text().split())
        inside = Path(f"/proc/{server.process.pid}/cgroup").read_text()
        assert f"0::/compaction-bench/{server.config.port}" in inside
        record = json.loads(pid_file(server.config.port).read_text())
        assert record["host_share"]["cpu_quota"] == 0.5 and record["cgroup"] == str(cgroup)
    assert not cgroup.exists()


@pytest.mark.skipif(_cpu_controller(), reason="cgroup v2's cpu controller is available here")
def test_a_quota_without_cgroup_v2s_cpu_controller_is_refused_and_nothing_starts() -> None:
    server = _server(HostShare(cpu_quota=0.5))
    with pytest.raises(EngineUnavailableError, match=r"^REPLICA_CPU_QUOTA needs cgroup v2.*"
                       r"REPLICA_CPUS=n") as refused:
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
