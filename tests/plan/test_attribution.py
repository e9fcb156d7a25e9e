"""GPU time attributed by processor sharing over the request records."""

from __future__ import annotations

import pytest

from compaction_bench.plan.attribution import Attribution, request_key
from compaction_bench.transport.request import RequestRecord


def _r(source: str, start: float, end: float, block: int | None = 1) -> RequestRecord:
    return RequestRecord(request_id=f"{source}-{start}", sent_s=start, end_s=end, status="ok",
                         source=source, regime="shared", block=block)


def test_overlapping_requests_share_the_engine_equally() -> None:
    a = _r("clean", 0.0, 4.0)
    b = _r("background", 2.0, 6.0, block=None)
    shares = Attribution([a, b], power=[(0.0, 100.0), (10.0, 100.0)], step_s=0.01)
    # a: alone for 2 s, shared for 2 s -> 3 s; b: shared 2 s, alone 2 s -> 3 s
    assert shares.share([a]).gpu_s == pytest.approx(3.0, abs=0.02)
    assert shares.share([b]).gpu_s == pytest.approx(3.0, abs=0.02)
    assert shares.share([a]).joules == pytest.approx(300.0, abs=3.0)
    assert Attribution([a]).share([a]).joules is None  # no power samples


def test_compressor_requests_count_as_their_arms() -> None:
    assert request_key(_r("self/compressor", 0, 1)) == ("shared", 1, "self", 1, "original")
    assert request_key(_r("background", 0, 1, block=None)) is None
