"""Each replica's share of the host (issue 29, item 3): the same CPU set and quota whether a
replica runs alone or among R, refused in one line where it does not fit, and recorded in the
server's pid file for the bench's manifest. No process is started here (tests/serve/
test_share_e2e.py starts one under a share)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compaction_bench.serve.command import build_command
from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.launcher import ServerConfig
from compaction_bench.serve.process import pid_file, recorded_shares, write_pid_file
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import replica_configs, server_config
from compaction_bench.serve.share import (
    NO_SHARE,
    HostShare,
    ShareError,
    cgroup_base,
    cgroup_label,
    cgroup_mount,
    cgroup_prefix,
    cgroup_v1_cpu_mount,
    check_cgroup,
    cpu_max,
    describe_share,
    host_share,
    make_cgroup,
    share_cpus,
    share_key,
)

FOUR = (0, 1, 2, 3)


def test_a_replica_gets_the_same_cpus_alone_and_among_others() -> None:
    share = HostShare(cpus=1)
    assert share_cpus(share, 1, FOUR) == [(0,)]
    assert share_cpus(share, 2, FOUR) == [(0,), (1,)]  # CPUs 2, 3 left for client and router
    assert share_cpus(HostShare(cpus=2), 2, (3, 2, 1, 0)) == [(0, 1), (2, 3)]
    assert share_cpus(HostShare(cpu_quota=0.9), 2, FOUR) is None  # a quota sets no CPU set
    assert share_cpus(NO_SHARE, 4, FOUR) is None and not NO_SHARE.given


def test_shares_that_do_not_fit_are_refused_naming_the_fix() -> None:
    with pytest.raises(ShareError, match=r"^REPLICAS=2 x REPLICA_CPUS=2 need 4 CPUs; this "
                       r"process may use 2 \(0,1\): use REPLICAS=1 or REPLICA_CPUS=1"):
        share_cpus(HostShare(cpus=2), 2, (0, 1))
    with pytest.raises(ShareError, match=r"REPLICAS=3 x REPLICA_CPUS=3 .* use REPLICAS=1 "
                       r"REPLICA_CPUS=2"):
        share_cpus(HostShare(cpus=3), 3, (0, 1))
    with pytest.raises(ShareError, match=r"REPLICAS=3 x REPLICA_CPU_QUOTA=0.9 need 2.7 CPUs.*"
                       r"use REPLICA_CPU_QUOTA=0.67 or less"):
        share_cpus(HostShare(cpu_quota=0.9), 3, (0, 1))
    with pytest.raises(ShareError, match=r"REPLICA_CPU_QUOTA=1\.5 is more than the REPLICA_CPUS=1"):
        HostShare(cpus=1, cpu_quota=1.5)
    with pytest.raises(ShareError, match="REPLICA_CPUS=0"):
        HostShare(cpus=0)
    with pytest.raises(ShareError, match="above 0"):
        HostShare(cpu_quota=0.0)


def test_server_configs_under_a_share_and_as_before_without() -> None:
    fake = ServerConfig(profile=load_profile("fake-faults"), port=18600)
    cpu = ServerConfig(profile=load_profile("cpu-tiny"), port=18600)
    share = HostShare(cpus=1, cpu_quota=0.9)
    alone = server_config(fake, share, cpus=(0, 1))
    fleet = replica_configs(fake, 2, cpus=(0, 1), share=share)
    assert (alone.cpus, alone.cpu_quota, alone.port) == ((0,), 0.9, 18600)
    assert [(c.cpus, c.cpu_quota, c.port) for c in fleet] == [((0,), 0.9, 18602),
                                                             ((1,), 0.9, 18603)]
    # without the setting: one server unpinned, a fake fleet unpinned, a CPU fleet split
    assert server_config(cpu, NO_SHARE, cpus=(0, 1)) == cpu
    assert [c.cpus for c in replica_configs(fake, 2, cpus=(0, 1))] == [(), ()]
    assert [(c.cpus, c.cpu_quota) for c in replica_configs(cpu, 2, cpus=(0, 1, 2))] == [
        ((0, 1), None), ((2,), None)]


def test_the_command_enters_its_cgroup_before_it_execs() -> None:
    config = ServerConfig(profile=load_profile("fake-faults"), port=18601, cpus=(1,),
                          cpu_quota=0.5)
    command = build_command(config, "fake")
    cgroup = str(cgroup_base() or Path("/sys/fs/cgroup")) + "/compaction-bench/18601"
    assert command[:4] == cgroup_prefix(Path(cgroup)) and command[4:7] == ["taskset", "-c", "1"]
    assert "cgroup.procs" in command[2] and command[2].endswith('exec "$@"')
    plain = build_command(ServerConfig(profile=load_profile("fake-faults"), port=18601), "fake")
    assert plain[0] != "/bin/sh" and "taskset" not in plain
    assert cpu_max(0.9) == "90000 100000" and cpu_max(2) == "200000 100000"


def _mounts(tmp_path: Path, *lines: str) -> Path:
    mounts = tmp_path / "mounts"
    mounts.write_text("".join(f"{line}\n" for line in lines))
    return mounts


def test_a_quota_with_no_cpu_controller_at_all_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailableError, match=r"needs a cgroup cpu controller, and none "
                       r"is mounted.*REPLICA_CPUS=n"):
        check_cgroup(_mounts(tmp_path))
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")
    mounts = _mounts(tmp_path, f"cgroup2 {v2} cgroup2 rw 0 0",
                     f"cgroup {tmp_path}/memory cgroup rw,relatime,memory 0 0")
    with pytest.raises(EngineUnavailableError, match=r"cgroup v2 at .* offers only hugetlb and "
                       r"no cgroup v1 cpu hierarchy is mounted: drop REPLICA_CPU_QUOTA") as no:
        check_cgroup(mounts)
    assert "\n" not in str(no.value) and not (v2 / "compaction-bench").exists()


def test_cgroup_v2_with_its_cpu_controller_is_used_first(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "unified", tmp_path / "cpu"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (v2 / "cgroup.subtree_control").write_text("memory\n")
    (v2 / "compaction-bench").mkdir()
    (v2 / "compaction-bench" / "cgroup.subtree_control").write_text("")
    mounts = _mounts(tmp_path, f"cgroup {v1} cgroup rw,relatime,cpu 0 0",
                     f"cgroup2 {v2} cgroup2 rw 0 0")
    assert cgroup_mount(mounts) == v2 and cgroup_base(mounts) == v2
    assert check_cgroup(mounts) == v2 / "compaction-bench"
    # the suite's folder is made and cpu enabled for its children
    assert (v2 / "cgroup.subtree_control").read_text() == "+cpu"
    assert (v2 / "compaction-bench" / "cgroup.subtree_control").read_text() == "+cpu"


def test_cgroup_v1s_cpu_hierarchy_where_cgroup_v2_has_no_cpu_controller(tmp_path: Path) -> None:
    """This project's machines: cgroup v2 mounted beside v1 (hybrid) without cpu, which v1 has;
    the quota goes to cpu.cfs_period_us and cpu.cfs_quota_us (plain files here: the kernel's
    side is in tests/serve/test_share_e2e.py)."""
    v2, v1 = tmp_path / "unified", tmp_path / "cpu,cpuacct"
    v2.mkdir()
    v1.mkdir()
    (v2 / "cgroup.controllers").write_text("\n")
    mounts = _mounts(tmp_path, f"cgroup {tmp_path}/cpuset cgroup rw,relatime,cpuset 0 0",
                     f"cgroup {v1} cgroup rw,nosuid,relatime,cpu,cpuacct 0 0",
                     f"cgroup2 {v2} cgroup2 rw 0 0")
    assert cgroup_v1_cpu_mount(mounts) == v1 and cgroup_base(mounts) == v1
    path = make_cgroup(18605, 0.5, mounts)
    assert path == v1 / "compaction-bench" / "18605"
    assert (path / "cpu.cfs_period_us").read_text() == "100000"
    assert (path / "cpu.cfs_quota_us").read_text() == "50000"
    assert not (path / "cpu.max").exists() and not (v2 / "compaction-bench").exists()
    assert cgroup_label(path) == f"v1:{path}" and cgroup_label(None) is None
    (path / "cgroup.controllers").write_text("cpu\n")  # what every cgroup v2 folder has
    assert cgroup_label(path) == f"v2:{path}"


def test_a_share_is_recorded_compared_by_size_and_quota_and_described() -> None:
    pinned = host_share((1,), 0.9)
    assert pinned == {"cpus": [1], "pinned": True, "cpu_quota": 0.9,
                      "host_cpus": os.cpu_count(), "cgroup": None}
    free = host_share((), None)
    assert free["cpus"] == sorted(os.sched_getaffinity(0)) and free["pinned"] is False
    assert share_key(pinned) == share_key(host_share((0,), 0.9)) == (1, 0.9)
    assert share_key(pinned) != share_key(host_share((0,), None))
    assert share_key(None) is None and share_key({"cpu_quota": 1}) is None
    assert describe_share(pinned) == f"1 CPU (1) of {os.cpu_count()}, quota 0.9 CPU"
    assert describe_share(None) == "not recorded"


def test_the_manifest_reads_each_servers_share_from_its_pid_file() -> None:
    try:
        write_pid_file(18782, {"pid": os.getpid(), "pgid": os.getpid(), "port": 18782,
                               "host_share": host_share((0,), None)})
        found = recorded_shares(["http://127.0.0.1:18782/v1", "http://elsewhere:8000",
                                 "http://127.0.0.1:18783"])
    finally:  # this test's own pid: no `stop` may ever find it
        pid_file(18782).unlink(missing_ok=True)
    assert found == [
        {"url": "http://127.0.0.1:18782", "host_share": host_share((0,), None)},
        {"url": "http://elsewhere:8000", "host_share": None},
        {"url": "http://127.0.0.1:18783", "host_share": None}]


def test_a_run_through_a_router_records_each_replicas_share() -> None:
    from compaction_bench.bench.run.config import BenchConfig
    from compaction_bench.bench.run.manifest import replica_shares

    ports = (18784, 18786, 18787)  # the router, then its replicas
    me = {"pid": os.getpid(), "pgid": os.getpid()}
    try:
        write_pid_file(ports[0], {**me, "port": ports[0], "router": {
            "policy": "round_robin", "replicas": [
                {"url": f"http://127.0.0.1:{p}"} for p in ports[1:]]}})
        for i, port in enumerate(ports[1:]):
            write_pid_file(port, {**me, "port": port, "host_share": host_share((i,), 0.9)})
        found = replica_shares(BenchConfig(port=ports[0]), f"http://127.0.0.1:{ports[0]}/v1")
    finally:  # this test's own pid: no `stop` may ever find it
        for port in ports:
            pid_file(port).unlink(missing_ok=True)
    assert found == [{"url": f"http://127.0.0.1:{p}", "host_share": host_share((i,), 0.9)}
                     for i, p in enumerate(ports[1:])]
