"""Real locust background runs, short and bounded: against the fake server and the real one."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import psutil
import pytest

from compaction_bench.common.files import read_jsonl
from compaction_bench.loadgen.background import (
    BackgroundConfig,
    BackgroundLoad,
    BackgroundLoadError,
)
from compaction_bench.loadgen.fakeprocess import FakeProcess
from compaction_bench.loadgen.metrics import MetricsSampler
from compaction_bench.serve.launcher import Server
from compaction_bench.transport.wire import ReplayOptions

pytestmark = pytest.mark.e2e

# the fake server's per-request override keeps replayed turns (up to ~2400 tokens) short
FAST = ReplayOptions(default_tool_gap_s=0.2, pace_tokens_per_s=2000,
                     extra_body={"fake": {"itl_ms": 0.5}})


def _run(config: BackgroundConfig, seconds: float) -> tuple[list[dict[str, object]], int]:
    with BackgroundLoad(config) as load:
        status = load.wait_steady(timeout_s=60)
        assert status.users == config.users and status.started == config.users
        load.set_block(7)
        time.sleep(seconds)
        assert load.process is not None
        pids = [p.pid for p in psutil.Process(load.process.pid).children(recursive=True)]
        pids.append(load.process.pid)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids), "a locust process outlived stop()"
    return read_jsonl(config.out).objects, len(pids)


def test_local_run_writes_open_loop_records(fake: FakeProcess, tmp_path: Path) -> None:
    origin = time.monotonic()
    config = BackgroundConfig(server_url=fake.server_url, users=3, spawn_rate=6, regime="shared",
                              out=tmp_path / "requests.jsonl", origin=origin, duration_s=60,
                              replay=FAST)
    rows, processes = _run(config, 2.0)
    assert processes == 1
    assert {r["labels"]["user"] for r in rows} == {0, 1, 2}
    assert all(r["source"] == "background" and r["regime"] == "shared" for r in rows)
    # each background agent's conversation is one session (X-Session-Id)
    assert all(r["session_id"] == f"bg-{r['labels']['user']}-c{r['labels']['cycle']}"
               for r in rows)
    assert {r["block"] for r in rows} <= {None, 7} and any(r["block"] == 7 for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 3
    for r in ok:
        assert isinstance(r["intended_send_s"], float) and isinstance(r["sent_s"], float)
        assert r["sent_s"] >= r["intended_send_s"] - 0.01  # never early
        assert 0.15 < r["first_token_s"] - r["sent_s"] < 1.0  # type: ignore[operator]
        assert len(r["chunk_times_s"]) == r["completion_tokens"] == r["labels"]["max_tokens"]  # type: ignore[arg-type,index]
    # user i is planned to start at i / spawn_rate after the schedule's start
    firsts = sorted((r["labels"]["user"], r["intended_send_s"]) for r in rows if r["request_id"]
                    in {"bg-0-0", "bg-1-0", "bg-2-0"})
    steps = [b[1] - a[1] for a, b in itertools.pairwise(firsts)]  # type: ignore[operator]
    assert steps == pytest.approx([1 / 6, 1 / 6], abs=1e-6)
    # requests cut by the stop are on record as errors, not lost
    assert all("stopped" in str(r["error"]) for r in rows if r["status"] != "ok")


def test_master_and_worker(fake: FakeProcess, tmp_path: Path) -> None:
    config = BackgroundConfig(server_url=fake.api_url, users=4, spawn_rate=8, regime="overloaded",
                              out=tmp_path / "requests.jsonl", origin=time.monotonic(),
                              workers=1, duration_s=60, replay=FAST)
    rows, processes = _run(config, 1.0)
    assert processes == 2  # master + 1 worker
    assert {r["labels"]["user"] for r in rows} == {0, 1, 2, 3}
    assert any(r["status"] == "ok" for r in rows)


def test_load_stops_by_itself(fake: FakeProcess, tmp_path: Path) -> None:
    config = BackgroundConfig(server_url=fake.server_url, users=1, spawn_rate=1,
                              out=tmp_path / "requests.jsonl", duration_s=1.5, replay=FAST)
    load = BackgroundLoad(config).start()
    assert load.process is not None
    assert load.process.wait(timeout=30) == 0
    load.stop()


@pytest.mark.integration
def test_real_server_has_requests_in_flight(cpu_server: Server, tmp_path: Path) -> None:
    config = BackgroundConfig(server_url=cpu_server.server_url, users=2, spawn_rate=4,
                              regime="shared", out=tmp_path / "requests.jsonl",
                              origin=time.monotonic(), duration_s=120,
                              replay=ReplayOptions(default_tool_gap_s=0.2))
    with MetricsSampler(cpu_server.server_url, tmp_path / "metrics.jsonl", interval_s=0.25), \
            BackgroundLoad(config) as load:
        status = load.wait_steady(timeout_s=60)
        assert status.in_flight >= 1
        time.sleep(1.5)
        # a record is appended when its request ends: on a busy 2-core host the first
        # background turn can outlast the window above
        deadline = time.monotonic() + 90
        while not read_jsonl(config.out).objects and time.monotonic() < deadline:
            time.sleep(0.5)
    samples = read_jsonl(tmp_path / "metrics.jsonl").objects
    running = [r.get("num_requests_running") or 0 for r in samples]
    assert max(running) >= 1
    rows = read_jsonl(config.out).objects
    assert rows and all(r["source"] == "background" for r in rows)


def test_all_unauthorized_background_is_refused_with_the_fix(fake: FakeProcess,
                                                            tmp_path: Path) -> None:
    config = BackgroundConfig(server_url=fake.server_url, users=2, spawn_rate=8,
                              out=tmp_path / "requests.jsonl", replay=ReplayOptions(
                                  default_tool_gap_s=0.2, pace_tokens_per_s=2000,
                                  extra_body={"fake": {"status": 401}}))
    with BackgroundLoad(config) as load, pytest.raises(BackgroundLoadError) as error:
        load.wait_steady(timeout_s=30)
    assert "refused as unauthorized" in str(error.value) and "API_KEY" in str(error.value)


def test_the_key_goes_with_every_background_request_and_the_load_lives_until_stopped(
        fake: FakeProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_KEY", "bg-secret")
    fake.reset()
    config = BackgroundConfig(server_url=fake.server_url, users=1, spawn_rate=4,
                              out=tmp_path / "requests.jsonl", replay=FAST)
    assert config.duration_s is None  # as long as the run: no expiry of its own
    with BackgroundLoad(config) as load:
        load.wait_steady(timeout_s=30)
        time.sleep(3.0)
        assert load.check().running
    bodies = fake.requests()
    assert bodies and all(b["authorization"] == "Bearer bg-secret" for b in bodies)
