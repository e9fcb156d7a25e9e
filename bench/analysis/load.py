"""The background load a block actually ran under, and whether that load was the regime's.

A pure function of the run's records: the background requests sent during the block
(`requests.jsonl`, source `background`), the server's /metrics samples inside the block's span
(`metrics.jsonl`; behind a router also each replica's, `replica_metrics.jsonl`) and the bench's
samples of the load's own state (`load.jsonl`). The bench calls it at every block's end and
writes the result into `blocks.jsonl`; analysis recomputes it from the raw records (`block_loads`,
the same function on the same files, where a background request still in flight at the block's
end has its record by then).

Each block gets a verdict (issues 22, 30): `failed` (the load was not the regime's: the block is
kept on record and out of the primary analysis), `unverified` (with why: the records cannot
show the regime's load either way; the block stays in and the report names it) or `verified`
(with `basis`, what it rests on; only a check that ran can be a basis). Lack of data is never
`verified`. The rules, judged on the samples taken while the arms ran (from their release, not
from the block's start: setup and replay come before it):

- Background load (shared and overloaded, where users are configured): the block fails when
  no background request ended or was in flight during it, whatever `load.jsonl` says; when the
  load was not running at some sample inside it; when background requests were refused as
  unauthorized (HTTP 401/403); when more than `MAX_BACKGROUND_ERROR_SHARE` of the background
  requests that ended in it failed; and (overloaded) when the achieved background concurrency
  while the arms ran was below `MIN_CONCURRENCY_SHARE` of the users. That concurrency is the
  records' time-average, or `load.jsonl`'s mean in-flight count where that is larger: at the
  block's end a request still in flight has no record yet. With no users configured the
  regime's load is not checked: unverified, never verified on a queue that can only be the
  arms' own.
- Queue (shared and overloaded): fewer than `MIN_SAMPLES` parsed samples of
  `vllm:num_requests_waiting` leave the block unverified. Overloaded fails when requests waited
  in fewer than `MIN_QUEUED_SHARE` of them and is verified otherwise; shared is verified when
  none waited (below capacity) and unverified when some did.
- Behind a router (`replica_metrics.jsonl` has lines), `metrics.jsonl` is the replicas' sum and
  a queue on one replica says nothing of another, so the queue is judged per replica, each on
  its own samples: verified when every replica passes; else judged on the replicas the arms'
  answered requests went to (`loadgen.replica_metrics.infer_replicas`), failed or unverified as
  theirs are; and unverified when some of the arms' requests cannot be attributed (requests
  that end together on several replicas, usual under load), never judged on the sum.
- Dedicated (no other traffic): the rise of `vllm:request_success_total` (`requests_finished`)
  from the first to the last sample while the arms ran is compared with the run's own answered
  requests to this server that ended in that interval widened by `OWN_SLACK_S` on each side
  (the server counts a request just before its client sees the end, and a scrape is stamped
  when it returned): vLLM does not count failed requests there, and an `external` compressor's
  requests go to another server (unless EXTERNAL_URL names the served one), so neither is the
  run's own. Any surplus fails the block. And at every sample, the server's requests in the
  system (`num_requests_running` plus `num_requests_waiting`) must not exceed the run's own
  requests to this server in flight then, each counted from `OWN_SLACK_S` before it was sent to
  `OWN_SLACK_S` after it ended (any status: a request that failed may still have run); a
  surplus fails the block (a foreign request that streams through the arms' whole span and
  ends after them never shows in the counter). Fewer than two counter samples, a counter that
  went down (a restarted server), one that rose by less than the run's own answered requests
  that ended well inside the interval (not this server's counter), or fewer than `MIN_SAMPLES`
  samples of either series leave it unverified. The slack only ever counts more requests as the
  run's own, so it can hide a foreign request near the edges, never invent one. Behind a
  router both series are the replicas' sums, which is what "no other traffic on the served
  capacity" needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
# overloaded: the achieved background concurrency while the arms ran, as a share of the
# configured users, below which the load did not run at its size (a stated policy: half; 64
# users that keep one request in flight do not overload a server the way the regime says)
MIN_CONCURRENCY_SHARE = 0.5
# the fewest parsed /metrics samples while the arms ran that a queue or traffic verdict rests on
# (a stated policy): at the bench's 1 s sampling, 10 s of the arms. With fewer, one sample moves
# the queued share by more than 10 points, and a scrape or two that happened to parse say
# nothing of the rest of the arms' run (issue 30: 1 of 301 scrapes parsed and verified a block)
MIN_SAMPLES = 10
BACKGROUND = "background"
# dedicated: how far outside the counter's interval a request of the run's own may end, and how
# long before its send and after its end it counts as in flight, and still count as the run's: a
# stated tolerance for the scrape's own latency (a scrape is stamped when it returned) and for
# the server counting a request just before or after its client sees the end (milliseconds on
# vLLM and the fake server). Wider hides more foreign requests near the edges; narrower risks a
# false failure when a scrape takes longer than this.
OWN_SLACK_S = 0.5


@dataclass(frozen=True)
class BlockLoad:
    """What one block's background load did. Concurrency is the time-average number of
    background requests in flight over the block's span (`arms_concurrency`: over the arms'
    run, the figure the overloaded check uses); `waiting_share` is the share of /metrics samples
    inside the span with at least one request waiting."""

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
    arms_samples: int | None = None  # parsed /metrics samples while the arms ran
    arms_concurrency: float | None = None
    # dedicated: the most requests the server held beyond the run's own in flight at a sample
    foreign_running: int | None = None

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


def served_elsewhere(source: str, external_here: bool = False) -> bool:
    """Whether a request of `source` went to a server other than the one measured: an
    `external` compressor's (EXTERNAL_URL, or the embedded server on PORT + 1), unless
    `external_here` (EXTERNAL_URL names the served server)."""
    arm, _, kind = source.rpartition("/")
    if kind != "compressor" or external_here:
        return False
    from compaction_bench.histories.policies.registry import UnknownArmError, parse_arm

    try:
        return parse_arm(arm).compressor == "external"
    except UnknownArmError:
        return False


def external_on_served(external_url: object, served_url: object) -> bool:
    """Whether EXTERNAL_URL names the served server (then the external compressor's requests
    are that server's too)."""
    from compaction_bench.common.errors import SuiteError
    from compaction_bench.common.net import server_url

    if not isinstance(external_url, str) or not isinstance(served_url, str):
        return False
    try:
        return server_url(external_url) == server_url(served_url)
    except SuiteError:
        return False


@dataclass(frozen=True)
class _Check:
    """One check's outcome: why it failed, why it could not tell, or what it found."""

    failed: str | None = None
    unverified: str | None = None
    basis: str | None = None


def _needed(share: float, n: int) -> int:
    """The fewest of `n` samples that make at least `share` of them."""
    return math.ceil(share * n - 1e-9)


def _queue_check(regime: str, waiting: list[float], where: str = "") -> _Check:
    """The queue verdict of one server's samples while the arms ran (module docstring)."""
    n = len(waiting)
    if not n:
        return _Check(unverified=(
            f"no vllm:num_requests_waiting sample{where} while the arms ran (another server, a "
            "key-protected /metrics or failed scrapes)"))
    if n < MIN_SAMPLES:
        return _Check(unverified=(
            f"{n} parsed /metrics sample(s){where} while the arms ran, fewer than the "
            f"{MIN_SAMPLES} a queue verdict needs: see the error lines of the metrics file "
            "(failed scrapes) or give the arms longer"))
    queued = sum(w > 0 for w in waiting)
    if regime == "overloaded":
        need = _needed(MIN_QUEUED_SHARE, n)
        if queued < need:
            return _Check(failed=(
                f"requests waited in {queued} of the {n} /metrics samples{where} while the arms "
                f"ran, fewer than the {need} ({MIN_QUEUED_SHARE:.0%}) that show the server "
                "stayed full: the background did not keep it full; raise the background users"))
        return _Check(basis=(f"requests waited in {queued} of the {n} /metrics samples{where} "
                             f"while the arms ran (at least {need}, {MIN_QUEUED_SHARE:.0%})"))
    if queued:
        return _Check(unverified=(
            f"requests waited in {queued} of the {n} /metrics samples{where} while the arms "
            "ran: the server was at capacity at times"))
    return _Check(basis=f"no request waited in the {n} /metrics samples{where} while the arms ran")


def _is_arm(request: RequestRecord) -> bool:
    return request.source not in (BACKGROUND, "probe", "") and "/" not in request.source


def _router_queue(regime: str, lines: Sequence[Mapping[str, Any]],
                  requests: list[RequestRecord], start: float, end: float) -> _Check:
    """The queue verdict behind a router: each replica on its own samples (module docstring)."""
    from compaction_bench.loadgen.replica_metrics import infer_replicas

    waiting: dict[str, list[float]] = {}
    for line in sorted(lines, key=lambda x: float(x["t_s"])):
        value = line.get("num_requests_waiting")
        series = waiting.setdefault(str(line["replica"]), [])
        if ("error" not in line and isinstance(value, int | float)
                and not isinstance(value, bool) and start <= float(line["t_s"]) <= end):
            series.append(float(value))
    checks = {replica: _queue_check(regime, values, f" of replica {replica}")
              for replica, values in sorted(waiting.items())}
    if all(c.basis for c in checks.values()):
        return _Check(basis="on every replica: " + "; ".join(str(c.basis)
                                                             for c in checks.values()))
    arms = [r for r in requests if _is_arm(r) and r.ok and r.end_s is not None
            and start <= r.end_s <= end]
    found = infer_replicas([r.to_json() for r in arms], [dict(x) for x in lines])
    used = sorted({a.replica for a in found.values() if a.replica is not None})
    unknown = sum(a.replica is None for a in found.values())
    if arms and not unknown and all(u in checks for u in used):
        went = f" (the arms' requests went to {', '.join(used)})"
        judged = [checks[u] for u in used]
        failed = [c.failed for c in judged if c.failed]
        unverified = [c.unverified for c in judged if c.unverified]
        if failed:
            return _Check(failed="; ".join(failed) + went)
        if unverified:
            return _Check(unverified="; ".join(unverified) + went)
        return _Check(basis="; ".join(str(c.basis) for c in judged))
    short = next(c.failed or c.unverified for c in checks.values() if not c.basis)
    why = (f"{unknown} of the arms' {len(arms)} answered requests could not be attributed to a "
           "replica (they ended as several replicas finished requests)" if arms else
           "the arms had no answered request to attribute to a replica")
    return _Check(unverified=(
        f"behind a router: {why}, and not every replica passed ({short}); the summed "
        "metrics.jsonl cannot say which queue the arms met"))


@dataclass(frozen=True)
class _Traffic:
    """A dedicated block's check that the server served only the run's own requests."""

    server_finished: float | None = None
    own_finished: int | None = None
    foreign: int | None = None
    foreign_running: int | None = None
    failed: tuple[str, ...] = ()
    unverified: str | None = None
    basis: str | None = None


def _running_check(own: list[RequestRecord], metrics: list[MetricSample], start: float,
                   end: float) -> tuple[int | None, str | None, int]:
    """(the most requests the server held beyond the run's own in flight at a sample, the
    reason that fails the block, the samples checked)."""
    samples = [m for m in metrics if start <= m.t_s <= end and m.num_requests_running is not None]
    worst: tuple[float, float, int] | None = None  # excess, t, own in flight
    for m in samples:
        held = float(m.num_requests_running or 0.0) + float(m.num_requests_waiting or 0.0)
        mine = sum(r.sent_s - OWN_SLACK_S <= m.t_s <= (
            r.end_s if r.end_s is not None else math.inf) + OWN_SLACK_S for r in own)
        if worst is None or held - mine > worst[0]:
            worst = (held - mine, m.t_s, mine)
    if worst is None:
        return None, None, 0
    excess = max(0, math.ceil(worst[0] - 1e-9))
    if not excess:
        return 0, None, len(samples)
    return excess, (
        f"the server held {worst[2] + worst[0]:g} requests at t={worst[1]:.1f} s (running and "
        f"waiting) while the run's own in flight were {worst[2]} (within {OWN_SLACK_S:g} s): a "
        "dedicated block had other traffic; run it on a server nothing else uses"), len(samples)


def _dedicated_traffic(own: list[RequestRecord], metrics: list[MetricSample],
                       start: float, end: float) -> _Traffic:
    """Whether the server served requests that are not the run's own between `start` (the
    arms' release) and `end`; `own` are the run's requests to this server (module docstring)."""
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
    answered = [r for r in own if r.ok and r.end_s is not None]
    mine = sum(first - OWN_SLACK_S < (r.end_s or 0.0) <= last + OWN_SLACK_S for r in answered)
    # answered requests that ended well inside the interval: the server surely counted them
    sure = sum(first + OWN_SLACK_S < (r.end_s or 0.0) <= last - OWN_SLACK_S for r in answered)
    if finished < sure:
        return _Traffic(server_finished=finished, own_finished=mine, unverified=(
            f"vllm:request_success_total rose by {finished:.0f} between t={first:.1f} s and "
            f"t={last:.1f} s, fewer than the {sure} answered requests of the run's own that "
            "ended then: not the served model's counter (another server's /metrics?), "
            "'no other traffic' is not checked"))
    foreign = max(0, round(finished) - mine)
    failed: list[str] = []
    if foreign:
        failed.append(
            f"{foreign} requests not ours (at least): the server finished {finished:.0f} "
            f"requests between t={first:.1f} s and t={last:.1f} s (vllm:request_success_total) "
            f"and the run's own answered requests to it end {mine} there (within "
            f"{OWN_SLACK_S:g} s): a dedicated block had other traffic; run it on a server "
            "nothing else uses")
    running, held, checked = _running_check(own, metrics, start, end)
    failed += [held] if held else []
    unverified = None
    if not failed and min(len(counted), checked) < MIN_SAMPLES:
        unverified = (
            f"{len(counted)} vllm:request_success_total and {checked} "
            "vllm:num_requests_running sample(s) while the arms ran, fewer than the "
            f"{MIN_SAMPLES} each that 'no other traffic' needs: see the error lines of the "
            "metrics file (failed scrapes) or give the arms longer")
    basis = (f"the server finished {finished:g} requests while the arms ran, no more than the "
             f"run's own answered requests to this server that ended then ({mine}, within "
             f"{OWN_SLACK_S:g} s), and held no more requests than the run's own in flight at "
             f"each of the {checked} /metrics samples")
    return _Traffic(server_finished=finished, own_finished=mine, foreign=foreign,
                    foreign_running=running, failed=tuple(failed), unverified=unverified,
                    basis=None if failed or unverified else basis)


def _concurrency(background: list[RequestRecord], load: list[LoadSample], start: float,
                 end: float) -> float:
    """Background requests in flight while the arms ran, time-averaged: the records', or
    load.jsonl's mean in-flight count where larger (a request still in flight at the block's
    end has no record when the bench judges it)."""
    records = sum(_overlap(r, start, end) for r in background) / max(end - start, 1e-9)
    counts = [s.in_flight for s in load if start <= s.t_s <= end and s.in_flight is not None]
    return max(records, sum(counts) / len(counts)) if counts else records


def block_load(regime: str, users: int, start: float, end: float,
               requests: list[RequestRecord], metrics: list[MetricSample],
               load: list[LoadSample], arms_from: float | None = None, *,
               replicas: Sequence[Mapping[str, Any]] = (),
               external_here: bool = False) -> BlockLoad:
    """The load figures of one block spanning [start, end] on the run clock, its verdict
    judged on the samples from `arms_from` (the arms' release; the start where unknown).
    `replicas`: the run's `replica_metrics.jsonl` lines (behind a router); `external_here`:
    EXTERNAL_URL names the served server (module docstring)."""
    span = max(end - start, 1e-9)
    arms = start if arms_from is None else arms_from
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
    during = [m.num_requests_waiting or 0.0 for m in inside if m.t_s >= arms]
    concurrency = _concurrency(background, load, arms, end)
    reasons: list[str] = []
    unverified: list[str] = []
    if regime != "dedicated" and users:
        if not background:
            said = (f", though load.jsonl says the load ran ({len(samples)} samples)"
                    if samples and stopped is None else "")
            reasons.append(f"no background request ended or was in flight during the block"
                           f"{said}: its {users} users sent nothing; see the load's log in the "
                           "run folder's background/")
        if stopped is not None:
            reasons.append(f"the background load was not running at t={stopped:.1f} s")
        if unauthorized:
            reasons.append(f"{unauthorized} background requests were refused as unauthorized "
                           "(HTTP 401/403): is API_KEY set for the load too?")
        if ended and len(errors) / len(ended) > MAX_BACKGROUND_ERROR_SHARE:
            reasons.append(f"{len(errors)} of {len(ended)} background requests that ended in the "
                           f"block failed (more than {MAX_BACKGROUND_ERROR_SHARE:.0%}); first: "
                           f"{errors[0].error}")
        floor = users * MIN_CONCURRENCY_SHARE
        if regime == "overloaded" and background and concurrency < floor:
            reasons.append(f"achieved background concurrency {concurrency:.2f} while the arms "
                           f"ran, below half the {users} users configured ({floor:g}): the load "
                           "did not run at its size; see the load's log in background/ (a "
                           "saturated load host?)")
    elif regime != "dedicated":
        unverified.append(f"no background users configured (users = 0) for a {regime} block: "
                          "a queue could only be the arms' own, so the regime's load is not "
                          "checked; set the regime's background users")
    traffic = _Traffic()
    check = _Check()
    if regime == "dedicated":
        own = [r for r in requests if r.source != BACKGROUND
               and not served_elsewhere(r.source, external_here)]
        traffic = _dedicated_traffic(own, metrics, arms, end)
        reasons += traffic.failed
        unverified += [traffic.unverified] if traffic.unverified else []
    elif users:
        check = (_router_queue(regime, replicas, requests, arms, end) if replicas
                 else _queue_check(regime, during))
        reasons += [check.failed] if check.failed else []
        unverified += [check.unverified] if check.unverified else []
    basis = None
    if not reasons and not unverified:  # what the verdict `verified` rests on
        basis = traffic.basis if regime == "dedicated" else check.basis
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
        foreign_requests=traffic.foreign, arms_samples=len(during),
        arms_concurrency=concurrency if users else None,
        foreign_running=traffic.foreign_running)


def regime_users(records: RunRecords) -> int:
    """Background users the run's regime had, from its manifest (0 where it says none)."""
    regime = records.manifest.get("regime")
    users = regime.get("background_users") if isinstance(regime, dict) else None
    return int(users) if isinstance(users, int) else 0


def _external_here(records: RunRecords) -> bool:
    config = records.manifest.get("config")
    server = records.manifest.get("server")
    return external_on_served(config.get("external_url") if isinstance(config, dict) else None,
                              server.get("api_url") if isinstance(server, dict) else None)


def run_block_load(records: RunRecords, regime: str, users: int, start: float, end: float,
                   arms_from: float | None = None,
                   replicas: Sequence[Mapping[str, Any]] | None = None) -> BlockLoad:
    """`block_load` of one block of a run folder as read: its regime's requests, the run's
    samples, the replicas' lines behind a router (`replicas`: read from the folder where not
    given) and where EXTERNAL_URL points. The bench at the block's end and `block_loads`
    afterwards both call this one."""
    from compaction_bench.bench.analysis.replicas import read_replica_lines

    return block_load(regime, users if regime != "dedicated" else 0, start, end,
                      [r for r in records.requests if r.regime == regime],
                      list(records.metrics), list(records.load), arms_from=arms_from,
                      replicas=read_replica_lines(records.path) if replicas is None else replicas,
                      external_here=_external_here(records))


def block_loads(records: RunRecords) -> dict[tuple[str, int], BlockLoad]:
    """The load of every block with a recorded span (blocks without one, as in imported study
    runs, have no load figures and no load verdict)."""
    from compaction_bench.bench.analysis.replicas import read_replica_lines

    users = regime_users(records)
    replicas = read_replica_lines(records.path)
    out = {}
    for block in records.blocks:
        if block.started_s is None or block.ended_s is None:
            continue
        out[(block.regime, block.block)] = run_block_load(
            records, block.regime, users, block.started_s, block.ended_s,
            arms_from=block.released_s, replicas=replicas)
    return out


def load_of(block: BlockRecord, loads: dict[tuple[str, int], BlockLoad]) -> BlockLoad | None:
    return loads.get((block.regime, block.block))
