"""The background load a block actually ran under, and whether that load was the regime's.

A pure function of the run's records: the background requests sent during the block
(`requests.jsonl`, source `background`), the server's /metrics samples inside the block's span
(`metrics.jsonl`) and the bench's samples of the load's own state (`load.jsonl`). The bench calls
it at every block's end and writes the result into `blocks.jsonl`; analysis recomputes it from
the raw records, so the two always agree.

A block is invalid, kept on record and left out of the primary analysis, when a regime that has
background users ran without them: the load was not running at some sample inside the block,
background requests were refused as unauthorized (HTTP 401/403), more than
`MAX_BACKGROUND_ERROR_SHARE` of the background requests that ended in the block failed, no
background activity was recorded at all, or (overloaded only) requests waited in fewer than
`MIN_QUEUED_SHARE` of the /metrics samples taken while the arms ran (from their release, not
from the block's start: setup and replay come before it).

Each block gets a verdict (issue 22): `failed` (the reasons above), `verified` (the regime's
load was seen while the arms ran: overloaded, requests waiting in at least `MIN_QUEUED_SHARE` of
the samples; shared, /metrics samples with none waiting, so the server stayed below capacity),
or `unverified`, with why: no /metrics sample while the arms ran (another server, a
key-protected /metrics, failed scrapes), or a shared block that queued at times. Lack of data is
never `verified`.

A dedicated block means no other traffic: while its arms ran, the server finished no request
but the run's own. The rise of `vllm:request_success_total` (`requests_finished` in
`metrics.jsonl`) from the first to the last sample taken while the arms ran is compared with the
run's own requests (every record in `requests.jsonl`: arms, compressors, probes) that ended in
that interval widened by `OWN_SLACK_S` on each side (the server counts a request just before
its client sees the end, and a scrape is stamped when it returned). Any surplus fails the block
(it is kept on record and out of the primary analysis); fewer than two counter samples, a
counter that went down (a restarted server) or one that rose by less than the run's own
answered requests that ended well inside the interval (not this server's counter) leave it
unverified. The widening only ever counts
more requests as the run's own, so it can hide a foreign request that ended within
`OWN_SLACK_S` of the interval's edges, never invent one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compaction_bench.bench.runfolder import (
    BlockRecord,
    LoadSample,
    MetricSample,
    RunRecords,
)
from compaction_bench.transport.request import RequestRecord

MAX_BACKGROUND_ERROR_SHARE = 0.10
# overloaded: the share of the arms' /metrics samples with a request waiting that shows the
# server stayed full while they ran (a stated policy, not a measured figure: half the time)
MIN_QUEUED_SHARE = 0.5
BACKGROUND = "background"
# dedicated: how far outside the counter's interval a request of the run's own may end and still
# count as the run's: a stated tolerance for the scrape's own latency (a scrape is stamped when
# it returned) and for the server counting a request just before or after its client sees the
# end (milliseconds on vLLM and the fake server). Wider hides more foreign requests near the
# edges; narrower risks a false failure when a scrape takes longer than this.
OWN_SLACK_S = 0.5


@dataclass(frozen=True)
class BlockLoad:
    """What one block's background load did. Concurrency is the time-average number of
    background requests in flight over the block's span; `waiting_share` is the share of
    /metrics samples inside the span with at least one request waiting."""

    users: int
    background_requests: int
    background_ok: int
    background_errors: int
    unauthorized: int
    achieved_concurrency: float | None
    metrics_samples: int
    waiting_share: float | None
    max_waiting: float | None
    load_samples: int
    load_stopped_at_s: float | None
    reasons: tuple[str, ...]
    unverified: tuple[str, ...] = ()  # why the regime's load could not be confirmed
    # dedicated: requests the server finished while the arms ran (the rise of
    # vllm:request_success_total), the run's own among them, and the difference
    server_finished: float | None = None
    own_finished: int | None = None
    foreign_requests: int | None = None
    basis: str | None = None  # what a verified verdict rests on, in words

    @property
    def valid(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        """failed, unverified or verified (module docstring)."""
        return "failed" if self.reasons else "unverified" if self.unverified else "verified"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def _overlap(request: RequestRecord, start: float, end: float) -> float:
    stop = request.end_s if request.end_s is not None else end
    return max(0.0, min(stop, end) - max(request.sent_s, start))


@dataclass(frozen=True)
class _Traffic:
    """A dedicated block's check that the server served only the run's own requests."""

    server_finished: float | None = None
    own_finished: int | None = None
    foreign: int | None = None
    failed: str | None = None
    unverified: str | None = None


def _dedicated_traffic(requests: list[RequestRecord], metrics: list[MetricSample],
                       start: float, end: float) -> _Traffic:
    """Whether the server finished requests that are not the run's own between `start` (the
    arms' release) and `end` (module docstring)."""
    counted = sorted((m for m in metrics if start <= m.t_s <= end
                      and m.requests_finished is not None), key=lambda m: m.t_s)
    if len(counted) < 2:
        return _Traffic(unverified=(
            f"{len(counted)} vllm:request_success_total sample(s) while the arms ran (another "
            "server, a key-protected /metrics or failed scrapes): 'no other traffic' is not "
            "checked"))
    values = [float(m.requests_finished or 0.0) for m in counted]
    drop = next((i for i in range(1, len(values)) if values[i] < values[i - 1]), None)
    if drop is not None:
        return _Traffic(unverified=(
            f"vllm:request_success_total went down at t={counted[drop].t_s:.1f} s (a restarted "
            "server?): 'no other traffic' is not checked"))
    first, last = counted[0].t_s, counted[-1].t_s
    finished = values[-1] - values[0]
    own = sum(r.end_s is not None and first - OWN_SLACK_S < r.end_s <= last + OWN_SLACK_S
              for r in requests)
    # answered requests that ended well inside the interval: the server surely counted them
    sure = sum(r.ok and r.end_s is not None and first + OWN_SLACK_S < r.end_s
               <= last - OWN_SLACK_S for r in requests)
    if finished < sure:
        return _Traffic(server_finished=finished, own_finished=own, unverified=(
            f"vllm:request_success_total rose by {finished:.0f} between t={first:.1f} s and "
            f"t={last:.1f} s, fewer than the {sure} answered requests of the run's own that "
            "ended then: not the served model's counter (another server's /metrics?), "
            "'no other traffic' is not checked"))
    foreign = max(0, round(finished) - own)
    failed = None
    if foreign:
        failed = (f"{foreign} requests not ours (at least): the server finished "
                  f"{finished:.0f} requests between t={first:.1f} s and t={last:.1f} s "
                  f"(vllm:request_success_total) and the run's own records end {own} there "
                  f"(within {OWN_SLACK_S:g} s): a dedicated block had other traffic; run it on "
                  "a server nothing else uses")
    return _Traffic(server_finished=finished, own_finished=own, foreign=foreign, failed=failed)


def block_load(regime: str, users: int, start: float, end: float,
               requests: list[RequestRecord], metrics: list[MetricSample],
               load: list[LoadSample], arms_from: float | None = None) -> BlockLoad:
    """The load figures of one block spanning [start, end] on the run clock, its verdict
    judged on the samples from `arms_from` (the arms' release; the start where unknown)."""
    span = max(end - start, 1e-9)
    background = [r for r in requests if r.source == BACKGROUND
                  and r.sent_s <= end and (r.end_s is None or r.end_s >= start)]
    ended = [r for r in background if r.end_s is not None and start <= r.end_s <= end]
    ok = [r for r in ended if r.status == "ok"]
    errors = [r for r in ended if r.status != "ok"]
    unauthorized = sum(r.http_status in (401, 403) for r in background)
    inside = [m for m in metrics if start <= m.t_s <= end and m.num_requests_waiting is not None]
    waiting = [m.num_requests_waiting or 0.0 for m in inside]
    samples = [s for s in load if start <= s.t_s <= end]
    stopped = next((s.t_s for s in samples if not s.running), None)
    reasons: list[str] = []
    if users:
        if not samples and not background:
            reasons.append("no background load was recorded during the block")
        if stopped is not None:
            reasons.append(f"the background load was not running at t={stopped:.1f} s")
        if unauthorized:
            reasons.append(f"{unauthorized} background requests were refused as unauthorized "
                           "(HTTP 401/403): is API_KEY set for the load too?")
        if ended and len(errors) / len(ended) > MAX_BACKGROUND_ERROR_SHARE:
            reasons.append(f"{len(errors)} of {len(ended)} background requests that ended in the "
                           f"block failed (more than {MAX_BACKGROUND_ERROR_SHARE:.0%}); first: "
                           f"{errors[0].error}")
    during = [m.num_requests_waiting or 0.0 for m in inside
              if m.t_s >= (start if arms_from is None else arms_from)]
    queued = sum(w > 0 for w in during) / len(during) if during else None
    unverified: list[str] = []
    traffic = _Traffic()
    if regime == "dedicated":
        traffic = _dedicated_traffic(requests, metrics,
                                     start if arms_from is None else arms_from, end)
        reasons += [traffic.failed] if traffic.failed else []
        unverified += [traffic.unverified] if traffic.unverified else []
    elif queued is None:
        unverified.append("no vllm:num_requests_waiting sample while the arms ran (another "
                          "server, a key-protected /metrics or failed scrapes)")
    elif regime == "overloaded" and users and queued < MIN_QUEUED_SHARE:
        reasons.append(f"requests waited in {queued:.0%} of the {len(during)} /metrics samples "
                       f"while the arms ran (fewer than {MIN_QUEUED_SHARE:.0%}): the background "
                       "did not keep the server full")
    elif regime == "shared" and queued > 0:
        unverified.append(f"requests waited in {queued:.0%} of the {len(during)} /metrics "
                          "samples while the arms ran: the server was at capacity at times")
    basis = None
    if not reasons and not unverified:  # what the verdict `verified` rests on
        if regime == "dedicated":
            basis = (f"the server finished {traffic.server_finished:g} requests between the "
                     "/metrics samples while the arms ran, no more than the run's own records "
                     f"end there ({traffic.own_finished}, within {OWN_SLACK_S:g} s)")
        elif regime == "overloaded":
            basis = (f"requests waited in {queued:.0%} of the {len(during)} /metrics samples "
                     f"while the arms ran (at least {MIN_QUEUED_SHARE:.0%})")
        else:
            basis = f"no request waited in the {len(during)} /metrics samples while the arms ran"
    return BlockLoad(
        basis=basis,
        users=users, background_requests=len(background), background_ok=len(ok),
        background_errors=len(errors), unauthorized=unauthorized,
        achieved_concurrency=(sum(_overlap(r, start, end) for r in background) / span
                              if background else (0.0 if users == 0 else None)),
        metrics_samples=len(inside),
        waiting_share=(sum(w > 0 for w in waiting) / len(waiting)) if waiting else None,
        max_waiting=max(waiting) if waiting else None, load_samples=len(samples),
        load_stopped_at_s=stopped, reasons=tuple(reasons), unverified=tuple(unverified),
        server_finished=traffic.server_finished, own_finished=traffic.own_finished,
        foreign_requests=traffic.foreign)


def regime_users(records: RunRecords) -> int:
    """Background users the run's regime had, from its manifest (0 where it says none)."""
    regime = records.manifest.get("regime")
    users = regime.get("background_users") if isinstance(regime, dict) else None
    return int(users) if isinstance(users, int) else 0


def block_loads(records: RunRecords) -> dict[tuple[str, int], BlockLoad]:
    """The load of every block with a recorded span (blocks without one, as in imported study
    runs, have no load figures and no load verdict)."""
    users = regime_users(records)
    out = {}
    for block in records.blocks:
        if block.started_s is None or block.ended_s is None:
            continue
        requests = [r for r in records.requests if r.regime == block.regime]
        out[(block.regime, block.block)] = block_load(
            block.regime, users if block.regime != "dedicated" else 0, block.started_s,
            block.ended_s, requests, list(records.metrics), list(records.load),
            arms_from=block.released_s)
    return out


def load_of(block: BlockRecord, loads: dict[tuple[str, int], BlockLoad]) -> BlockLoad | None:
    return loads.get((block.regime, block.block))
