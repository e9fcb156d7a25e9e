"""The vLLM-named serving figures on requests whose every time is known, so each figure can be
worked out by hand: which requests count (inside the regime's blocks, completed), what each
latency is, and what the throughputs divide by."""

from __future__ import annotations

import math

import pytest

from compaction_bench.bench.analysis.serving import requests_table, serving_figures
from compaction_bench.bench.runfolder import BlockRecord, RunRecords
from compaction_bench.transport.request import RequestRecord


def request(rid: str, sent: float, chunks: tuple[float, ...], *, source: str = "clean",
            block: int | None = 1, status: str = "ok", prompt: int = 100,
            intended: float | None = None) -> RequestRecord:
    return RequestRecord(request_id=rid, sent_s=sent, status=status, source=source,
                         regime="shared", block=block, intended_send_s=intended,
                         first_token_s=chunks[0] if status == "ok" else None,
                         end_s=chunks[-1] if status == "ok" else None,
                         chunk_times_s=chunks if status == "ok" else (),
                         prompt_tokens=prompt, completion_tokens=len(chunks))


def records() -> RunRecords:
    requests = (
        # two completed clean requests: ttft 0.5 and 1.0 s, gaps 0.25 s and 0.5 s
        request("a", 10.0, (10.5, 10.75, 11.0)),
        request("b", 20.0, (21.0, 21.5, 22.0), intended=19.0),
        request("c", 30.0, (31.0,), status="error"),  # failed: counted, not timed
        request("d", 40.0, (40.1, 40.2), block=None),  # outside every block: not counted
        request("e", 10.0, (10.2, 10.4), source="background", prompt=50),
    )
    blocks = (BlockRecord(regime="shared", block=1, started_s=5.0, ended_s=25.0),
              BlockRecord(regime="shared", block=2, started_s=20.0, ended_s=45.0))
    return RunRecords(run_id="known", path=None, manifest={}, arms=(), requests=requests,
                      blocks=blocks)


def test_figures_worked_out_by_hand() -> None:
    out = serving_figures(records())
    clean, background = out["shared"]["clean"], out["shared"]["background"]
    # blocks 5-25 s and 20-45 s overlap: the regime spans 40 s
    assert clean["duration"] == 40.0 and clean["completed"] == 2 and clean["failed"] == 1
    assert clean["total_input_tokens"] == 200 and clean["total_output_tokens"] == 6
    assert clean["request_throughput"] == pytest.approx(2 / 40)
    assert clean["total_token_throughput"] == pytest.approx(206 / 40)
    assert clean["mean_ttft_ms"] == pytest.approx(750.0)
    assert clean["median_e2el_ms"] == pytest.approx(1500.0)  # 1.0 and 2.0 s
    assert clean["mean_tpot_ms"] == pytest.approx((250.0 + 500.0) / 2)  # (e2el - ttft) / 2
    # every gap between streamed chunks of both requests: 0.25, 0.25, 0.5, 0.5
    assert clean["mean_itl_ms"] == pytest.approx(375.0)
    assert clean["p99_itl_ms"] == pytest.approx(500.0)
    assert clean["median_e2el_intended_ms"] == pytest.approx(3000.0)  # only b had a schedule
    assert background["completed"] == 1 and background["mean_itl_ms"] == pytest.approx(200.0)
    assert math.isclose(background["std_ttft_ms"], 0.0)


def test_the_frame_holds_every_request_with_its_derived_latencies() -> None:
    frame = requests_table(records())
    assert list(frame["request_id"]) == ["a", "b", "c", "d", "e"]
    assert frame.loc[frame["request_id"] == "b", "ttft_s"].item() == pytest.approx(1.0)
    assert frame.loc[frame["request_id"] == "c", "e2el_s"].isna().all()
    assert str(frame["block"].dtype) == "Int64"


def test_a_group_with_no_completed_request_has_no_latencies() -> None:
    only_failed = RunRecords(run_id="x", path=None, manifest={}, arms=(),
                             requests=(request("c", 30.0, (31.0,), status="error"),))
    figures = serving_figures(only_failed)["shared"]["clean"]
    assert figures["completed"] == 0 and figures["failed"] == 1
    assert figures["duration"] == 0.0 and figures["request_throughput"] is None
    assert figures["mean_ttft_ms"] is None and figures["p99_itl_ms"] is None
