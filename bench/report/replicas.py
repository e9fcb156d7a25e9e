"""The run report's section on the replicas behind a router: traffic, prompt and cached tokens
and queueing per replica, and the prefix-cache hit rate of the arms' continuation requests.
Every column says whether it comes from the replicas' and router's counters or from the run's
request records attributed to a replica (bench/analysis/replicas.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_bench.bench.analysis.latency import CacheRate
from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.replicas import (
    ContinuationCache,
    ReplicaAccount,
    continuation_cache,
    run_replica_account,
)
from compaction_bench.bench.report.changes import time_effect
from compaction_bench.bench.report.document import Paragraph, Section, Table
from compaction_bench.common.markdown import MISSING, number, percent


def _num(value: float | None, digits: int = 0) -> str:
    return number(value, digits)


def _share(part: float | None, whole: float | None) -> str:
    return percent(None if part is None or not whole else part / whole, 0, fraction=True)


def rate_cell(rate: CacheRate) -> str:
    """'62% (n=14)': sum cached / sum prompt tokens and the requests it sums."""
    if rate.hit_rate is None:
        return f"{MISSING} (n={rate.n_requests})"
    return f"{rate.hit_rate:.0%} (n={rate.n_requests})"


def replica_table(account: ReplicaAccount, caption_prefix: str = "") -> Table:
    """One row per replica: counters first, then the attributed request records."""
    routed_total = account.routed_total
    rows = tuple((
        r.replica,
        f"{_num(r.routed)} ({_share(r.routed, routed_total)})",
        _num(r.finished),
        _num(r.prompt_tokens),
        _num(r.cached_tokens),
        percent(r.hit_rate, 0, fraction=True),
        _num(r.queue_time_mean_s, 3),
        f"{_num(r.waiting_mean, 2)} / {_num(r.waiting_max)}",
        f"{r.inferred_requests}: {r.inferred_cached_tokens} / {r.inferred_prompt_tokens}",
    ) for r in account.replicas)
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(account.unattributed_reasons.items()))
    span = ("" if account.span_s is None else
            f" over t = {account.span_s[0]:.1f}-{account.span_s[1]:.1f} s of the run clock")
    return Table(
        ("Replica", "Routed (router counter, share)", "Finished (replica counter)",
         "Prompt tokens (prefix-cache queries)", "Cached tokens (prefix-cache hits)",
         "Hit rate (counters)", "Mean queue time, s (counters)",
         "Waiting: mean / max (gauge samples)",
         "Attributed requests: cached / prompt tokens (records)"),
        rows,
        f"{caption_prefix}Counters: deltas of each replica's own /metrics and of the router's "
        f"count of HTTP requests it sent there (its health probes and /v1/models count too), "
        f"scraped about every second{span}; they cover all traffic, background included. "
        f"Records: the run's ok requests that ended in that span ({account.requests_ok}), "
        f"attributed to a replica only where it was the only one whose finished count rose as "
        f"the request ended: {account.attributed} attributed"
        + (f", unattributed: {reasons}" if reasons else "") + ".")


def continuation_table(rates: Sequence[ContinuationCache],
                       effect: Callable[[str, str], str]) -> Table:
    """The arms' continuation cache per regime, each beside its time effect (`effect(regime,
    arm)`): a hit rate alone is not a speedup."""
    return Table(
        ("Regime", "Arm", "Fork request: hit rate", "Later requests: hit rate", "All",
         "Postfork time: change vs clean [95% CI]"),
        tuple((c.regime, c.arm, rate_cell(c.first), rate_cell(c.later), rate_cell(c.all),
               effect(c.regime, c.arm)) for c in rates),
        "The arms' own ok requests (no compressor or background request): sum cached / sum "
        "prompt tokens as each response's usage reported them; n counts requests. The fork "
        "request is each attempt's first postfork request, where a rewrite breaks the cached "
        "prefix; later requests hit only where the router sent the agent back to the replica "
        "holding its prefix.")


def replica_sections(analysis: RunAnalysis) -> list[Section]:
    """The per-replica section, for a run made through a router (none otherwise)."""
    account = run_replica_account(analysis.records)
    router = analysis.records.manifest.get("router")
    if account is None and not isinstance(router, dict):
        return []
    section = Section("Replicas behind the router")
    if isinstance(router, dict):
        section.add(Paragraph(
            f"Routing policy: {router.get('policy', 'not stated')} (the router at "
            f"{router.get('url', '?')}, started by {router.get('started_by', 'the bench')}, in "
            f"front of {len(router.get('replicas') or [])} replicas)."))
    if account is None:
        section.add(Paragraph("No replica_metrics.jsonl lines: the replicas' /metrics were not "
                              "scraped, so there are no per-replica figures."))
        return [section]
    section.add(replica_table(account),
                continuation_table(continuation_cache(analysis.records.requests,
                                                      analysis.arms),
                                   lambda regime, arm: time_effect(analysis, regime, arm)))
    return [section]
