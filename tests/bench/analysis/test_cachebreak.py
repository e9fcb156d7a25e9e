"""Cache-break accounting on a hand-made run folder (real files) whose truth is known: which
blocks each request finds cached, where a rewrite breaks the prefix, what a salt isolates, and
which requests cannot be checked or disagree (named by request id)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compaction_bench.bench.analysis.cachebreak import cache_accounting, kv_block_size
from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    RequestRecord,
    read_run,
    write_json,
    write_records,
)
from compaction_bench.transport.prefixhash import prefix_label

P0 = list(range(1000, 1070))  # a 70-token prompt
C0 = list(range(2000, 2010))  # its 10-token reply
EXTRA = list(range(3000, 3020))


def request(rid: str, arm: str, prompt: list[int], completion: list[int], times: tuple[float,
            float, float], cached: int | None, *, label: bool = True,
            prompt_tokens: int | None = None) -> RequestRecord:
    sent, first, end = times
    labels: dict[str, Any] = {"attempt": "original"}
    if label:
        labels["kv_prefix"] = prefix_label(prompt, completion)
    return RequestRecord(request_id=rid, sent_s=sent, status="ok", source=arm, regime="dedicated",
                         block=1, first_token_s=first, end_s=end,
                         prompt_tokens=len(prompt) if prompt_tokens is None else prompt_tokens,
                         cached_tokens=cached, completion_tokens=len(completion), labels=labels)


def write_run(path: Path, more: tuple[RequestRecord, ...] = ()) -> Path:
    """The run folder; `more`: further requests, each of its own arm (no salt)."""
    edited = [*P0[:40], -1, *P0[41:]]  # a policy rewrote token 40 of text it had sent before
    requests = [
        request("clean-0", "clean", P0, C0, (0.0, 1.0, 2.0), 0),
        request("clean-1", "clean", [*P0, *C0, *EXTRA], C0, (3.0, 4.0, 5.0), 64),
        request("keep-0", "keep", P0, C0, (0.5, 1.5, 2.5), 64),  # ran beside clean-0
        request("keep-1", "keep", [*edited, *C0, *EXTRA], C0, (6.0, 7.0, 8.0), 32),
        request("iso-0", "iso", P0, C0, (9.0, 10.0, 11.0), 64),  # its own salt: cold, yet 64
        request("iso-1", "iso", [*P0, *C0], C0, (12.0, 13.0, 14.0), 64, label=False),
        request("iso-2", "iso", [*P0, *C0], C0, (15.0, 16.0, 17.0), 64, prompt_tokens=99),
        *more,
    ]
    arms = [ArmRecord("dedicated", 1, arm, "original", "complete", 10.0,
                      cache_salt="s1" if arm == "iso" else None)
            for arm in ("clean", "keep", "iso", *(r.source for r in more))]
    write_json(path / "manifest.json", {"run_id": "cb", "arms": ["clean", "keep", "iso"],
                                        "selfcheck": {"cache_config": {"block_size": "32"}}})
    write_records(path / "arms.jsonl", arms)
    write_records(path / "blocks.jsonl", [BlockRecord("dedicated", 1, ("clean", "keep", "iso"),
                                                      0.0, 20.0)])
    write_records(path / "requests.jsonl", requests)
    return path


def test_predicted_beside_measured_with_breaks_and_losses(tmp_path: Path) -> None:
    result = cache_accounting(read_run(write_run(tmp_path / "cb")), ["clean", "keep", "iso"])
    assert (result.block_size, result.block_source) == (32, "server")
    rows = {r.request_id: r for r in result.requests}
    # keep-0 was sent (0.5 s) before clean-0's first token (1.0 s): the server may have cached
    # its identical prompt before clean-0's prefill, so up to 64 may be cached (measured: 0)
    assert (rows["clean-0"].predicted_low, rows["clean-0"].predicted_high) == (0, 64)
    # prompt and reply of clean-0: floor((70 + 10 - 1) / 32) * 32 = 64 cached once it ended
    one = rows["clean-1"]
    assert (one.predicted_low, one.predicted_high, one.measured, one.exact) == (64, 64, 64, True)
    assert (one.break_token, one.break_region, one.reusable, one.loss_predicted) == (
        80, "previous reply", 64, 0)
    # keep-0 was sent before clean-0's first token and started after it: 0 surely, 64 maybe
    assert (rows["keep-0"].predicted_low, rows["keep-0"].predicted_high) == (0, 64)
    assert rows["keep-0"].agrees and rows["keep-0"].exact
    edit = rows["keep-1"]
    assert (edit.break_token, edit.break_region) == (32, "old text")  # token 40 is in unit 2
    assert (edit.predicted_low, edit.loss_predicted, edit.loss_measured) == (32, 32, 32)
    # iso's salt keeps it from the others' blocks: 0 predicted, 64 measured, named by its id
    assert [(r.request_id, r.disagreement) for r in result.disagreements] == [("iso-0",
                                                                               "warmer")]
    assert all(r.disagreement is None for r in result.requests if r.agrees)
    assert dict((rid, why.split(" (")[0]) for rid, _, why in result.unchecked) == {
        "iso-1": "no token ids", "iso-2": "prompt truncated or altered: 80 ids returned, usage "
                                          "says 99"}
    summary = {a.arm: a for a in result.arms}
    assert summary["keep"].added_vs_clean == (32.0,) and summary["keep"].loss_old_text == 32
    assert summary["clean"].added_vs_clean == () and summary["iso"].n_checked == 1
    assert summary["iso"].n_requests == 3 and summary["clean"].n_exact == 2


def test_block_size_from_server_then_profile_then_vllm_default() -> None:
    assert kv_block_size({"selfcheck": {"cache_config": {"block_size": "128"}}}) == (128, "server")
    assert kv_block_size({"server": {"profile": {"engine_args": {"block_size": 256}}}}) == (
        256, "profile")
    assert kv_block_size({"selfcheck": {"skipped": "SELFCHECK=0"}}) == (16, "default")


def test_a_hit_below_what_the_run_left_is_colder(tmp_path: Path) -> None:
    later = request("evicted-0", "evicted", P0, C0, (18.0, 19.0, 20.0), 0)  # clean left 64
    result = cache_accounting(read_run(write_run(tmp_path / "cb", (later,))),
                              ["clean", "keep", "iso", "evicted"])
    row = {r.request_id: r for r in result.requests}["evicted-0"]
    assert (row.predicted_low, row.measured, row.agrees, row.disagreement) == (64, 0, False,
                                                                               "colder")


def passed(rid: str, arm: str, prompt: list[int], times: tuple[float, float, float],
           cached: int, block_pass: int) -> RequestRecord:
    record = request(rid, arm, prompt, C0, times, cached)
    if block_pass > 1:  # as the bench labels it: only from the second pass on
        record.labels["block_pass"] = block_pass
    return record


def write_rerun(path: Path, *, second_closed: bool = True) -> Path:
    """Block 1 run twice under CACHE=isolated (a salt per arm and pass): in pass 1 keep
    rewrote text it had sent (32 tokens lost), in pass 2 it did not."""
    edited = [*P0[:40], -1, *P0[41:]]
    requests = [
        passed("clean-p1-0", "clean", P0, (0.0, 1.0, 2.0), 0, 1),
        passed("clean-p1-1", "clean", [*P0, *C0, *EXTRA], (3.0, 4.0, 5.0), 64, 1),
        passed("keep-p1-0", "keep", P0, (0.5, 1.5, 2.5), 0, 1),
        passed("keep-p1-1", "keep", [*edited, *C0, *EXTRA], (6.0, 7.0, 8.0), 32, 1),
        passed("clean-p2-0", "clean", P0, (100.0, 101.0, 102.0), 0, 2),  # a new salt: cold
        passed("clean-p2-1", "clean", [*P0, *C0, *EXTRA], (103.0, 104.0, 105.0), 64, 2),
        passed("keep-p2-0", "keep", P0, (100.5, 101.5, 102.5), 0, 2),
        passed("keep-p2-1", "keep", [*P0, *C0, *EXTRA], (106.0, 107.0, 108.0), 64, 2),
    ]
    arms = [ArmRecord("dedicated", 1, arm, "original", "complete", 10.0,
                      cache_salt=f"{arm}-p{p}", block_pass=p if p > 1 else None)
            for p in (1, 2) for arm in ("clean", "keep")]
    blocks = [BlockRecord("dedicated", 1, ("clean", "keep"), 0.0, 10.0)]
    if second_closed:
        blocks.append(BlockRecord("dedicated", 1, ("clean", "keep"), 99.0, 110.0,
                                  block_pass=2))
    write_json(path / "manifest.json", {"run_id": "rerun", "arms": ["clean", "keep"],
                                        "selfcheck": {"cache_config": {"block_size": "32"}}})
    write_records(path / "arms.jsonl", arms)
    write_records(path / "blocks.jsonl", blocks)
    write_records(path / "requests.jsonl", requests)
    return path


def test_a_block_run_again_is_accounted_from_its_last_pass_only(tmp_path: Path) -> None:
    """Issue 22: the accounting mixed the passes of a block run again after RESUME: both
    passes' rows, keep's loss summed over them (32 added vs clean, not pass 2's 0), and pass
    1's salt-isolated cache predicted warm for pass 2 (a false 'colder')."""
    result = cache_accounting(read_run(write_rerun(tmp_path / "rr")), ["clean", "keep"])
    rows = {r.request_id: r for r in result.requests}
    assert set(rows) == {"clean-p2-0", "clean-p2-1", "keep-p2-0", "keep-p2-1"}
    assert (rows["clean-p2-0"].predicted_low, rows["clean-p2-0"].predicted_high) == (0, 0)
    assert not result.disagreements
    summary = {a.arm: a for a in result.arms}
    assert summary["keep"].added_vs_clean == (0.0,) and summary["keep"].loss_measured == 0
    assert (summary["keep"].n_requests, summary["keep"].n_checked) == (2, 2)
    other = sorted(rid for rid, _, why in result.unchecked if "pass of a block run" in why)
    assert other == ["clean-p1-0", "clean-p1-1", "keep-p1-0", "keep-p1-1"]


def test_a_pass_no_block_record_closed_does_not_count(tmp_path: Path) -> None:
    """A crash cut pass 2 before its block record: pass 1 counts, as in the primary
    analysis, and pass 2's requests are listed, not mixed in."""
    result = cache_accounting(read_run(write_rerun(tmp_path / "rr", second_closed=False)),
                              ["clean", "keep"])
    assert {r.request_id for r in result.requests} == {"clean-p1-0", "clean-p1-1",
                                                       "keep-p1-0", "keep-p1-1"}
    assert {a.arm: a for a in result.arms}["keep"].added_vs_clean == (32.0,)
    assert len([why for _, _, why in result.unchecked if "pass of a block run again" in why]) == 4


def test_behind_a_router_each_replica_has_its_own_cache(tmp_path: Path) -> None:
    """Issue 24: behind a router a request finds only what its own replica cached. clean's
    second request went to the other replica and found nothing: with one cache for the run it
    read 'colder' than predicted (64 tokens); per replica it is predicted cold and agrees. A
    request whose replica is not known is not checked and fills no cache."""
    import json

    from compaction_bench.loadgen.replica_metrics import REPLICA_METRICS

    path = tmp_path / "rt"
    requests = [
        request("clean-0", "clean", P0, C0, (0.0, 1.0, 2.0), 0),
        request("clean-1", "clean", [*P0, *C0, *EXTRA], C0, (3.0, 4.0, 5.0), 0),
        request("clean-2", "clean", [*P0, *C0, *EXTRA], C0, (6.0, 7.0, 7.5), 64),
    ]
    write_json(path / "manifest.json", {"run_id": "rt", "arms": ["clean"],
                                        "selfcheck": {"cache_config": {"block_size": "32"}}})
    write_records(path / "arms.jsonl", [ArmRecord("dedicated", 1, "clean", "original",
                                                  "complete", 10.0)])
    write_records(path / "blocks.jsonl", [BlockRecord("dedicated", 1, ("clean",), 0.0, 20.0)])
    write_records(path / "requests.jsonl", requests)
    # replica A finished a request between the scrapes at 1.5 and 2.5 s (clean-0), B between
    # 4.5 and 5.5 s (clean-1); at 7.5 s both counters rose: clean-2's replica is not known
    scrapes = {"A": [(0.5, 0), (1.5, 0), (2.5, 1), (4.5, 1), (5.5, 1), (7.0, 1), (8.0, 2)],
               "B": [(0.5, 0), (1.5, 0), (2.5, 0), (4.5, 0), (5.5, 1), (7.0, 1), (8.0, 2)]}
    (path / REPLICA_METRICS).write_text("".join(
        json.dumps({"t_s": t, "replica": f"http://{name}", "requests_finished": n}) + "\n"
        for name, points in scrapes.items() for t, n in points))
    result = cache_accounting(read_run(path), ["clean"])
    assert result.per_replica
    rows = {r.request_id: r for r in result.requests}
    assert set(rows) == {"clean-0", "clean-1"}
    assert (rows["clean-1"].predicted_low, rows["clean-1"].predicted_high) == (0, 0)
    assert rows["clean-1"].agrees and rows["clean-1"].disagreement is None
    assert ("clean-2", "clean") in {(rid, arm) for rid, arm, _ in result.unchecked}
    # the same folder without the replicas' lines: one cache, clean-1 predicted warm
    (path / REPLICA_METRICS).unlink()
    single = {r.request_id: r for r in cache_accounting(read_run(path), ["clean"]).requests}
    assert single["clean-1"].predicted_low == 64 and single["clean-1"].disagreement == "colder"


def test_a_twin_sent_earlier_may_have_cached_the_prompt_before_its_first_token_came(
        tmp_path: Path) -> None:
    """CI (2026-12-06): a side-by-side arm's fork request was fully cached by another arm's
    identical one that was sent earlier but whose first token the client saw later (the server
    caches blocks when a prefill ends, before the stream reaches the client). Its hit lies
    within the predicted range, not 'warmer'."""
    twin = list(range(5000, 5070))
    more = (request("late-first", "late", twin, C0, (20.0, 22.0, 23.0), 0),
            request("early-first", "early", twin, C0, (20.1, 21.0, 21.5), 64))
    result = cache_accounting(read_run(write_run(tmp_path / "cb", more)),
                              ["clean", "keep", "iso", "late", "early"])
    rows = {r.request_id: r for r in result.requests}
    early = rows["early-first"]
    assert (early.predicted_low, early.predicted_high) == (0, 64)
    assert early.agrees and early.disagreement is None
