"""Merging workers' raw records: the clock anchor's arithmetic and every refusal (pure files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.files import JsonlWriter, append_jsonl, read_jsonl
from compaction_bench.loadgen.background import BackgroundConfig
from compaction_bench.loadgen.merge import (
    MERGES_FILE,
    REMOTE_FILE,
    Anchor,
    MergeError,
    merge_workers,
    pending_remote,
    worker_files,
    write_sidecar,
)
from compaction_bench.transport.request import RequestRecord

ORIGIN = 1000.0  # the run's start on the master's clock


def _worker(folder: Path, name: str, requests: list[tuple[int, int, float]], *,
            worker_s: float = 5.0, sent: float = 1100.0, back: float = 1100.002,
            records: int | None = None, stopped: bool = True) -> Path:
    """A worker folder as locust_main writes it: raw records on the worker's clock."""
    files = worker_files(folder, name)
    writer = JsonlWriter(files.raw)
    for user, number, sent_s in requests:
        writer.write(RequestRecord(
            request_id=f"bg-{user}-{number}", sent_s=sent_s, status="ok", source="background",
            intended_send_s=sent_s - 0.001, first_token_s=sent_s + 0.2, end_s=sent_s + 0.5,
            chunk_times_s=(sent_s + 0.2, sent_s + 0.5), labels={"user": user}).to_json())
    writer.close()
    anchor: dict[str, Any] = {"worker_s": worker_s, "master_sent_s": sent, "master_back_s": back}
    write_sidecar(files, host="h", pid=1, index=0, origin_s=ORIGIN, anchor=anchor,
                  records=len(requests) if records is None else records, stopped=stopped)
    return folder


def test_anchor_maps_the_worker_clock_to_the_master_within_half_the_round_trip() -> None:
    anchor = Anchor(worker_s=5.0, master_sent_s=1100.0, master_back_s=1100.002)
    assert anchor.offset_s == pytest.approx(1095.001, abs=1e-9)
    assert anchor.precision_s == pytest.approx(0.001, abs=1e-12)


def test_two_workers_merge_onto_the_run_timeline_in_send_order(tmp_path: Path) -> None:
    # worker a's clock runs 1095.001 s behind the master's, worker b's 995.001 s ahead
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0), (0, 1, 8.0), (2, 0, 7.0)])
    b = _worker(tmp_path / "b", "b", [(1, 0, 2097.5), (1, 1, 2098.5)],
                worker_s=2100.0, sent=1104.999, back=1105.001)
    out = tmp_path / "run" / "requests.jsonl"
    merged = merge_workers([a, b], out, expected_workers=2)
    assert [(m.name, m.records, m.users) for m in merged] == [("a", 3, (0, 2)), ("b", 2, (1,))]
    rows = read_jsonl(out).objects
    assert [r["request_id"] for r in rows] == ["bg-0-0", "bg-2-0", "bg-1-0", "bg-0-1", "bg-1-1"]
    times = {r["request_id"]: r["sent_s"] for r in rows}
    # master time = worker time + offset; run time = master time - ORIGIN
    assert times["bg-0-0"] == pytest.approx(6.0 + 1095.001 - ORIGIN)
    assert times["bg-1-0"] == pytest.approx(2097.5 + (1105.0 - 2100.0) - ORIGIN)
    first = next(r for r in rows if r["request_id"] == "bg-0-0")
    assert first["first_token_s"] - first["sent_s"] == pytest.approx(0.2)
    assert first["chunk_times_s"][-1] == pytest.approx(first["end_s"])
    assert {r["labels"]["worker"] for r in rows} == {"a", "b"}
    assert len(read_jsonl(out.parent / "background" / MERGES_FILE).objects) == 2


def test_a_duplicated_record_is_refused_naming_the_file(tmp_path: Path) -> None:
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0), (0, 1, 7.0), (0, 1, 7.0)])
    with pytest.raises(MergeError, match=r"requests-a\.jsonl: line 3: bg-0-1 duplicated"):
        merge_workers([a], tmp_path / "requests.jsonl")
    assert not (tmp_path / "requests.jsonl").exists()  # nothing half-merged


def test_a_missing_record_is_refused_naming_the_file(tmp_path: Path) -> None:
    # the worker says it wrote 3, its file holds 2
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0), (0, 1, 7.0)], records=3)
    with pytest.raises(MergeError, match=r"requests-a\.jsonl: 2 records, but the worker wrote "
                       r"3: 1 lost"):
        merge_workers([a], tmp_path / "requests.jsonl")
    # a gap in one user's numbering, though the count agrees
    b = _worker(tmp_path / "b", "b", [(0, 0, 6.0), (0, 2, 7.0)])
    with pytest.raises(MergeError, match=r"requests-b\.jsonl: user 0 request bg-0-1 missing"):
        merge_workers([b], tmp_path / "requests.jsonl")


def test_the_same_record_in_two_workers_or_merged_twice_is_refused(tmp_path: Path) -> None:
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0)])
    b = _worker(tmp_path / "b", "b", [(0, 0, 6.0)])
    with pytest.raises(MergeError, match=r"bg-0-0 duplicated \(also in .*requests-a\.jsonl\)"):
        merge_workers([a, b], tmp_path / "requests.jsonl")
    out = tmp_path / "requests.jsonl"
    merge_workers([a], out)
    with pytest.raises(MergeError, match=r"bg-0-0 is already in .*merged before"):
        merge_workers([a], out)
    assert len(read_jsonl(out).objects) == 1
    # a resumed run's next start of the load numbers its users from 0 again: not a duplicate
    merge_workers([_worker(tmp_path / "later", "later", [(0, 0, 9.0)])], out)
    assert [r["request_id"] for r in read_jsonl(out).objects] == ["bg-0-0", "bg-0-0"]


def test_an_agent_split_across_workers_is_refused(tmp_path: Path) -> None:
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0)])
    b = _worker(tmp_path / "b", "b", [(0, 1, 6.0)])
    with pytest.raises(MergeError, match=r"user 0 also sent from .*one agent split"):
        merge_workers([a, b], tmp_path / "requests.jsonl")


def test_a_worker_that_did_not_stop_cleanly_needs_consent(tmp_path: Path) -> None:
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0)], records=0, stopped=False)
    with pytest.raises(MergeError, match=r"worker-a\.json: the worker did not stop cleanly.*"
                       "allow_unfinished=1"):
        merge_workers([a], tmp_path / "requests.jsonl")
    assert merge_workers([a], tmp_path / "requests.jsonl", allow_unfinished=True)[0].records == 1


def test_missing_files_are_named(tmp_path: Path) -> None:
    a = _worker(tmp_path / "a", "a", [(0, 0, 6.0)])
    (a / "worker-a.json").unlink()
    with pytest.raises(MergeError, match=r"worker-a\.json: missing"):
        merge_workers([a], tmp_path / "requests.jsonl")
    with pytest.raises(MergeError, match="no such folder"):
        merge_workers([tmp_path / "nowhere"], tmp_path / "requests.jsonl")
    with pytest.raises(MergeError, match="1 workers' records, 2 expected"):
        merge_workers([_worker(tmp_path / "c", "c", [])], tmp_path / "r.jsonl",
                      expected_workers=2)


def test_each_background_user_has_its_own_lasting_cache_salt() -> None:
    config = BackgroundConfig(server_url="http://x", users=2, out=Path("r.jsonl"),
                              origin=12.5, seed=3)
    assert config.user_salt(0) == config.user_salt(0) == "bg-3-12.500000-bg0"
    assert config.user_salt(0) != config.user_salt(1)
    named = config.model_copy(update={"cache_salt": "run-7"})
    assert named.user_salt(4) == "run-7-bg4"


def test_remote_workers_count_as_missing_until_merged_from_their_folders(tmp_path: Path) -> None:
    run = tmp_path / "run"
    state = run / "background"
    assert pending_remote(state).pending == 0  # no remote workers: nothing missing
    # two starts of the load (a resumed run), one and two remote workers
    append_jsonl(state / REMOTE_FILE, {"remote_workers": 1, "master": "0.0.0.0:5557"})
    append_jsonl(state / REMOTE_FILE, {"remote_workers": 2, "master": "0.0.0.0:5557"})
    # a load's own local worker, merged when it stopped, is not a remote one
    merge_workers([_worker(tmp_path / "local", "l-1", [(0, 0, 6.0)])], run / "requests.jsonl",
                  remote=False)
    assert pending_remote(state).pending == 3
    merge_workers([_worker(tmp_path / "b", "b-1", [(1, 0, 6.0)]),
                   _worker(tmp_path / "c", "c-1", [(2, 0, 6.5)])], run / "requests.jsonl")
    got = pending_remote(state)
    assert (got.expected, got.merged, got.pending) == (3, 2, 1)
    assert [m["remote"] for m in read_jsonl(state / MERGES_FILE).objects] == [False, True, True]
