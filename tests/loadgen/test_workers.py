"""Background load across hosts, on one host: a master, two workers started by themselves
(`compaction-bench load worker`), their records merged (`compaction-bench load merge`); and each
background user's own cache salt. Real locust processes against the fake server."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.files import read_jsonl
from compaction_bench.common.net import free_port
from compaction_bench.common.paths import histories_root
from compaction_bench.loadgen.background import (
    BackgroundConfig,
    BackgroundLoad,
    default_history_paths,
)
from compaction_bench.loadgen.fakeprocess import FakeProcess
from compaction_bench.transport.wire import ReplayOptions

pytestmark = pytest.mark.e2e

FAST = ReplayOptions(default_tool_gap_s=0.2, pace_tokens_per_s=2000,
                     extra_body={"fake": {"itl_ms": 0.5}})
CLI = [sys.executable, "-m", "compaction_bench"]


def test_two_workers_make_one_merged_run_with_no_record_lost_or_duplicated(
        fake: FakeProcess, tmp_path: Path) -> None:
    run = tmp_path / "run"
    port = free_port()
    config = BackgroundConfig(server_url=fake.server_url, users=6, spawn_rate=12,
                              regime="overloaded", out=run / "requests.jsonl",
                              origin=time.monotonic(), remote_workers=2, master_port=port,
                              duration_s=120, replay=FAST)
    folders = [tmp_path / "host-b", tmp_path / "host-c"]
    workers: list[subprocess.Popen[bytes]] = []
    logs = [(tmp_path / f"{out.name}.log").open("wb") for out in folders]
    try:
        with BackgroundLoad(config) as load:
            # one worker started with the settings' words, one with the flags (aliases)
            forms = [["master=" + f"127.0.0.1:{port}", "out={}"],
                     ["--master", f"127.0.0.1:{port}", "--out", "{}"]]
            workers = [subprocess.Popen(
                [*CLI, "load", "worker", *(w.format(out) for w in forms[i % 2])],
                stdout=log, stderr=subprocess.STDOUT)
                for i, (out, log) in enumerate(zip(folders, logs, strict=True))]
            status = load.wait_steady(timeout_s=90)
            assert status.users == 6 and status.started == 6  # counters relayed by workers
            load.set_block(7)
            time.sleep(1.0)
            # as on another host: no block file where the workers look; the master relays
            # the last number it read (7), so records sent from now on still carry it
            assert load.config.block_file is not None
            load.config.block_file.unlink()
            unlinked = time.monotonic() - config.origin
            time.sleep(1.5)
        # the master's quit reaches the workers; each writes its count and ends
        assert [w.wait(timeout=60) for w in workers] == [0, 0]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for log in logs:
            log.close()
    assert not (run / "requests.jsonl").exists()  # no worker wrote into the run folder itself
    merge = subprocess.run([*CLI, "load", "merge", str(run), *map(str, folders),
                            "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert merge.returncode == 0, merge.stderr
    assert merge.stdout.count("clock anchor +-") == 2
    # one host, one monotonic clock: the true offset is 0, which the anchor must bracket
    anchors = read_jsonl(run / "background" / "merges.jsonl").objects
    assert len(anchors) == 2
    assert all(abs(a["offset_s"]) <= a["precision_s"] < 1.0 for a in anchors)

    rows = read_jsonl(run / "requests.jsonl").objects
    written = sum(int(json.loads(p.read_text())["records"])
                  for folder in folders for p in folder.glob("worker-*.json"))
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)) == written > 6  # none lost, none duplicated
    assert [r["sent_s"] for r in rows] == sorted(r["sent_s"] for r in rows)
    by_user: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_user[r["labels"]["user"]].append(r)
    assert set(by_user) == set(range(6))
    # each agent on one worker, both workers used, each agent's requests numbered 0..n-1
    owner = {u: {r["labels"]["worker"] for r in rs} for u, rs in by_user.items()}
    assert all(len(w) == 1 for w in owner.values())
    assert len(set.union(*owner.values())) == 2
    for user, rs in by_user.items():
        numbers = sorted(int(str(r["request_id"]).rsplit("-", 1)[1]) for r in rs)
        assert numbers == list(range(len(numbers))), user
    # one timeline: user i is planned at i / spawn_rate, whichever worker (clock) it ran on;
    # consecutive users sit on different workers: each worker placed the schedule's start on
    # its clock with the anchor the merge uses, so the plan comes back exact
    firsts = [min(float(r["intended_send_s"]) for r in by_user[u]) for u in range(6)]
    steps = [b - a for a, b in itertools.pairwise(firsts)]
    assert steps == pytest.approx([1 / 12] * 5, abs=1e-6)
    assert 0 <= firsts[0] < 30
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(float(r["sent_s"]) >= float(r["intended_send_s"]) - 0.01 for r in ok)
    assert any(r["block"] == 7 for r in rows)
    relayed = [r for r in rows if float(r["sent_s"]) > unlinked + 0.1]
    assert relayed and all(r["block"] == 7 for r in relayed)


def test_each_background_user_sends_its_own_lasting_cache_salt(fake: FakeProcess,
                                                              tmp_path: Path) -> None:
    fake.reset()
    history = default_history_paths(histories_root())[0]
    config = BackgroundConfig(server_url=fake.server_url, users=2, spawn_rate=8,
                              out=tmp_path / "requests.jsonl", origin=time.monotonic(),
                              histories=[history], duration_s=60, replay=FAST)
    with BackgroundLoad(config) as load:
        load.wait_steady(timeout_s=60)
        time.sleep(1.5)
    bodies = [b for b in fake.requests() if b["path"] == "/v1/chat/completions"]
    salts: dict[str, list[list[object]]] = defaultdict(list)
    for body in bodies:
        salts[str(body.get("cache_salt"))].append(body["messages"])
    # two users replaying the same history: two salts, never the server-wide shared cache
    assert set(salts) == {config.user_salt(0), config.user_salt(1)}
    for sequence in salts.values():
        # one user's requests keep its salt, and each extends the one before (its prefix hits)
        assert len(sequence) >= 2
        for before, after in itertools.pairwise(sequence):
            if len(after) > len(before):
                assert after[:len(before)] == before
    rows = read_jsonl(config.out).objects
    assert {(r["labels"]["user"], r["labels"]["cache_salt"]) for r in rows} == {
        (0, config.user_salt(0)), (1, config.user_salt(1))}


def test_load_run_with_two_local_workers_merges_them_when_it_ends(fake: FakeProcess,
                                                                  tmp_path: Path) -> None:
    config = BackgroundConfig(server_url=fake.server_url, users=4, spawn_rate=8,
                              out=tmp_path / "run" / "requests.jsonl", origin=time.monotonic(),
                              workers=2, duration_s=4, replay=FAST)
    config.save(tmp_path / "bg.json")
    done = subprocess.run([*CLI, "load", "run", str(tmp_path / "bg.json")], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(config.out).objects
    merges = read_jsonl(tmp_path / "run" / "background" / "merges.jsonl").objects
    assert len(merges) == 2 and sum(m["records"] for m in merges) == len(rows) > 4
    assert len({r["request_id"] for r in rows}) == len(rows)
    assert {r["labels"]["user"] for r in rows} == set(range(4))


def test_a_bad_merge_ends_with_one_line_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "host-b"
    folder.mkdir()
    line = json.dumps({"request_id": "bg-0-0", "sent_s": 1.0, "source": "background"})
    (folder / "requests-b-1.jsonl").write_text(f"{line}\n{line}\n")
    (folder / "worker-b-1.json").write_text(json.dumps({
        "worker": "b-1", "records": 2, "stopped": True, "origin_s": 0.0,
        "anchor": {"worker_s": 0.0, "master_sent_s": 0.0, "master_back_s": 0.001}}))
    done = subprocess.run([*CLI, "load", "merge", str(tmp_path / "run"), str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "requests-b-1.jsonl: line 2: bg-0-0 duplicated" in last
    assert not (tmp_path / "run" / "requests.jsonl").exists()
