"""Report sections about how a run was served and whether its numbers can be trusted: the
background load per block, the fork's cache state per arm, the run's noise and what it can
detect, per-request latency (the suite's own table and vLLM's names), the prefix cache and the
server queue. Rendered from one `RunAnalysis`, like the rest of the report."""

from __future__ import annotations

from collections.abc import Mapping

from compaction_bench.bench.analysis.paired import RunAnalysis
from compaction_bench.bench.analysis.power import MAX_BLOCKS, Sensitivity
from compaction_bench.bench.analysis.stats import Distribution
from compaction_bench.bench.report.changes import interval_text, median_text, time_effect
from compaction_bench.bench.report.document import Bullets, Image, Paragraph, Section, Table
from compaction_bench.common.markdown import MISSING, number, percent
from compaction_bench.loadgen.merge import pending_remote


def _fmt(value: object, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | None):
        return str(value)
    return number(value, digits)


def remote_summary(analysis: RunAnalysis) -> dict[str, object]:
    """summary.json's word on remote workers, where the run had any: their records are in the
    background figures only once merged (`pending` 0)."""
    if analysis.records.path is None:
        return {}
    remote = pending_remote(analysis.records.path / "background")
    if not remote.expected:
        return {}
    return {"background_remote_workers": {"expected": remote.expected, "merged": remote.merged,
                                          "pending": remote.pending}}


def unmerged_note(analysis: RunAnalysis) -> str | None:
    """What a run with LOCUST_REMOTE_WORKERS is missing until their records are merged: every
    background count below would otherwise under-count silently."""
    run_dir = analysis.records.path
    if run_dir is None:
        return None
    remote = pending_remote(run_dir / "background")
    if not remote.pending:
        return None
    return (f"Incomplete: {remote.pending} of {remote.expected} remote workers' background "
            "records are not merged yet (they are on the workers' hosts), so the background "
            "requests below count only what the bench's host recorded. Copy each worker's "
            f"out= folder here, run `compaction-bench load merge {run_dir} DIR... workers="
            f"{remote.pending}`, then `make report RUN={analysis.run_id}`.")


def trust_sections(analysis: RunAnalysis) -> list[Section]:
    """Load per block, the fork's cache state per arm, and what the run's noise can detect."""
    load = Section("Background load per block")
    if (missing := unmerged_note(analysis)) is not None:
        load.add(Paragraph(missing))
    rows = []
    for block in analysis.blocks:
        figures = block.load
        if figures is None:
            continue
        rows.append((block.regime, str(block.block), str(figures.users),
                     f"{figures.background_requests} ({figures.background_errors} errors)",
                     _fmt(figures.achieved_concurrency),
                     percent(figures.waiting_share, 0, fraction=True),
                     _fmt(figures.max_waiting, 0),
                     figures.verdict + (": " + "; ".join(figures.reasons or figures.unverified)
                                        if figures.reasons or figures.unverified else
                                        f": {figures.basis}" if figures.basis else "")))
    if rows:
        counts = {v: sum(b.load is not None and b.load.verdict == v for b in analysis.blocks)
                  for v in ("verified", "unverified", "failed")}
        load.add(Table(("Regime", "Block", "Users", "Background requests", "Achieved "
                        "concurrency", "Samples waiting", "Max waiting", "Load"), tuple(rows),
                       "Background requests during the block; achieved concurrency = the time "
                       "average of background requests in flight over the block; samples "
                       "waiting = /metrics samples with a request queued. Load verdict, judged "
                       "on the samples while the arms ran (bench/analysis/load.py): "
                       + ", ".join(f"{n} {v}" for v, n in counts.items()) + ". A failed "
                       "block stays on record and out of the primary analysis; an unverified "
                       "one stays in, with why."))
    else:
        load.add(Paragraph("No block spans recorded: no load figures (imported runs)."))
    cache = Section("Prefix cache at the fork")
    states = [r for r in analysis.records.arms if r.fork_cache_state is not None]
    if states:
        cache.add(Table(("Regime", "Block", "Arm", "Attempt", "Cached / prompt tokens", "State",
                         "Cache"), tuple(
            (r.regime, str(r.block), r.arm, r.attempt,
             f"{r.fork_cached_tokens} / {r.fork_prompt_tokens}", str(r.fork_cache_state),
             r.cache_mode or MISSING) for r in states),
            "The first postfork request of each attempt: cold = nothing cached, warm = all but "
            "the last partial KV block, partial between. Shared cache: arms may warm each "
            "other's prefix; isolated: a cache_salt per arm and attempt."))
    else:
        cache.add(Paragraph("No attempt recorded its fork cache state (older or imported run)."))
    noise = analysis.noise
    power = ", ".join(f"{n if n is not None else f'more than {MAX_BLOCKS}'} blocks for a "
                      f"{effect:.0%} change" for effect, n in noise.blocks_for.items())
    reach = Section("What these numbers can say").add(Bullets((
        f"block-to-block noise: sigma = {noise.sigma:.3f} (log ratio arm/clean), from "
        f"{noise.sigma_source}" + (f" (n={noise.sigma_n})" if noise.sigma_n else
                                   " (no usable blocks: an assumed 0.1)"),
        false_positive_line(noise),
        f"blocks needed for 80% power at this noise: {power}",
    )))
    placebo = [c.arms["placebo"].postfork for name, c in analysis.primary.items()
               if "placebo" in c.arms and not (name == "pooled" and len(analysis.regimes) == 1)]
    if placebo:
        cells = "; ".join(
            f"median {median_text(c)} {interval_text(c, 2)} (n={c.n})"
            if interval_text(c) is not None and c.median_pct is not None
            else f"n={c.n}, no interval" for c in placebo)
        reach.add(Paragraph(f"Placebo arm (clean's file under another name, with its own "
                            f"sampling seed and cache salt: an A/A): {cells}. Its "
                            "interval must cover 0; where it does not, the noise is larger "
                            "than the interval says."))
    return [load, cache, reach]


def false_positive_line(noise: Sensitivity) -> str:
    """The false-positive rate of the reported interval at each n of this run's comparisons."""
    if not noise.false_positive:
        return "false-positive rate: no complete blocks, so no interval to be wrong"
    cells = "; ".join(
        f"{f.rate:.1%} at {n} blocks (exact {f.exact:.1%})" if f.reported else
        f"none at {n} blocks, where no interval is printed ([min, max] would exclude 0 in "
        f"{f.rate:.1%}, exact {f.exact:.1%})" for n, f in noise.false_positive.items())
    return ("false-positive rate of the reported 95% interval at this run's blocks per "
            f"comparison, seeded simulation at this noise ({noise.false_positive_reps} null "
            f"runs each): {cells}")


def _dist(d: Distribution, scale: float, digits: int) -> str:
    if not d.n:
        return "n=0"
    values = " / ".join(f"{scale * d.percentiles[p]:.{digits}f}" for p in (50, 90, 99))
    return f"{values} (n={d.n})"


def serving_sections(analysis: RunAnalysis, images: Mapping[str, bytes | None]) -> list[Section]:
    latency = Section("Request latency")
    if not analysis.latency:
        latency.add(Paragraph("No requests.jsonl records: latency not available for this run."))
    else:
        latency.add(Table(
            ("Regime", "Source", "Requests (errors)", "TTFT s p50/p90/p99",
             "inter-token ms p50/p90/p99", "request s p50/p90/p99", "send lag ms p50/p90/p99"),
            tuple((r.regime, r.source, f"{r.n_requests} ({r.n_errors})", _dist(r.ttft, 1, 3),
                   _dist(r.inter_token, 1000, 1), _dist(r.request_time, 1, 2),
                   _dist(r.send_lag, 1000, 1)) for r in analysis.latency),
            "TTFT (first token - send) is the queue-time proxy; send lag (send - intended send) "
            "shows whether the load generator kept its schedule."))
        if images.get("latency_cdfs"):
            latency.add(Image("latency_cdfs.png", images["latency_cdfs"] or b"",
                              "Latency CDFs per regime and source (log scale)."))
    cache = Section("Prefix cache")  # each hit rate beside the time effect of its arm
    rated = [c for c in analysis.cache if c.n_requests]
    if not rated:
        cache.add(Paragraph("No per-request cached/prompt token counts: cache hit rate not "
                            "available for this run."))
    else:
        cache.add(Table(
            ("Regime", "Source", "Hit rate", "Cached / prompt tokens", "Requests",
             "Postfork time: change vs clean [95% CI]"),
            tuple((c.regime, c.source, percent(c.hit_rate, 1, fraction=True),
                   f"{c.cached_tokens} / {c.prompt_tokens}", str(c.n_requests),
                   time_effect(analysis, c.regime, c.source)) for c in rated),
            "Sum of cached tokens over sum of prompt tokens, beside the time effect measured in "
            "the same blocks: a hit rate is not a speedup (a high one can come with a small "
            "or no saving), so it is never shown alone."))
        if images.get("cache_rates"):
            cache.add(Image("cache_rates.png", images["cache_rates"] or b"",
                            "Prefix-cache hit rate per source."))
    if analysis.cache_check:
        cache.add(Table(
            ("Regime", "Block spans", "All sources, from requests", "From /metrics counters"),
            tuple((c.regime, str(c.n_spans),
                   percent(c.from_requests, 1, fraction=True),
                   percent(c.from_metrics, 1, fraction=True))
                  for c in analysis.cache_check),
            "Cross-check: server-wide counter deltas (hits / queries) over the regime's blocks."))
    server = Section("Server queue and KV cache")
    if not analysis.records.metrics:
        server.add(Paragraph("No metrics.jsonl samples: server queue not available."))
    else:
        server.add(Bullets(tuple(
            f"max requests waiting, {name}: {'n/a' if v is None else f'{v:.0f}'}"
            for name, v in analysis.max_waiting.items())))
        if images.get("server_timeseries"):
            server.add(Image("server_timeseries.png", images["server_timeseries"] or b"",
                             "Waiting/running requests and KV-cache usage; shaded spans are "
                             "blocks, coloured by regime."))
    return [latency, _serving_section(analysis), cache, server]


def _ms(value: object) -> str:
    return number(value if isinstance(value, int | float) else None, 1)


def _serving_section(analysis: RunAnalysis) -> Section:
    """The per-request figures under `vllm bench serve`'s names (summary.json `serving`)."""
    section = Section("Serving figures (vLLM benchmark names)")
    rows = [(regime, source, f"{f['completed']} ({f['failed']})", _ms(f["duration"]),
             _ms(f["request_throughput"] and f["request_throughput"] * 60),
             _ms(f["output_throughput"]), f"{_ms(f['median_ttft_ms'])} / {_ms(f['p99_ttft_ms'])}",
             f"{_ms(f['median_tpot_ms'])} / {_ms(f['p99_tpot_ms'])}",
             f"{_ms(f['median_itl_ms'])} / {_ms(f['p99_itl_ms'])}",
             f"{_ms(f['median_e2el_ms'])} / {_ms(f['p99_e2el_ms'])}")
            for regime, sources in analysis.serving.items() for source, f in sources.items()]
    if not rows:
        return section.add(Paragraph("No requests inside block spans: no serving figures."))
    return section.add(Table(
        ("Regime", "Source", "completed (failed)", "duration s", "requests/min",
         "output tok/s", "TTFT ms median / p99", "TPOT ms median / p99",
         "ITL ms median / p99", "E2EL ms median / p99"), tuple(rows),
        "Requests inside the regime's blocks; throughput per the blocks' total span. The same "
        "figures, with mean, std and p90 too, are in summary.json under `serving`, named as "
        "`vllm bench serve --save-result` names them (median_ttft_ms, p99_itl_ms, ...)."))
