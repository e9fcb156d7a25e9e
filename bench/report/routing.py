"""The routing comparison of `make bench ROUTER_POLICY=a,b`: per policy and arm, the paired
change vs clean with its interval (each policy's own run, analysed on its own blocks), the
prefix-cache hit rate of the arms' continuation requests, and each replica's traffic.

A policy's paired change is measured within its run (clean and the arm in the same block,
through the same router); two policies' changes come from runs made one after the other, so a
difference between them also carries whatever drifted in between, and the document says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from compaction_bench.bench.analysis.paired import POOLED, RunAnalysis, analyze
from compaction_bench.bench.analysis.replicas import (
    ContinuationCache,
    continuation_cache,
    run_replica_account,
)
from compaction_bench.bench.report.changes import CLEAN_CONTEXT, change_cell
from compaction_bench.bench.report.compare import check_comparable
from compaction_bench.bench.report.document import (
    Bullets,
    Document,
    Paragraph,
    Section,
    Table,
    to_markdown,
)
from compaction_bench.bench.report.replicas import rate_cell, replica_table
from compaction_bench.bench.report.run_report import interval_line
from compaction_bench.bench.runfolder import REFERENCE_ARM, RunRecords, read_run, regime_sort_key
from compaction_bench.common.files import write_text_atomic
from compaction_bench.common.markdown import MISSING


def routing_file(results: Path, base: str) -> Path:
    """Where the comparison of the runs `<base>-<policy>` goes: beside them."""
    return results / f"{base}-routing.md"


def _policy(analysis: RunAnalysis) -> str:
    router = analysis.records.manifest.get("router")
    if isinstance(router, dict) and router.get("policy"):
        return str(router["policy"])
    return analysis.run_id


def _rates(analysis: RunAnalysis) -> dict[tuple[str, str], ContinuationCache]:
    return {(c.regime, c.arm): c
            for c in continuation_cache(analysis.records.requests, analysis.arms)}


def routing_document(base: str, runs: Mapping[str, RunAnalysis],
                     missing: Mapping[str, str] | None = None) -> Document:
    """The comparison of one run per policy (`runs`: policy -> its analysis, in the order they
    ran); `missing`: policies without a run folder, and why."""
    analyses = list(runs.values())
    if len(analyses) > 1:
        check_comparable(analyses)
    first = analyses[0] if analyses else None
    router = first.records.manifest.get("router") if first else None
    replicas = (router or {}).get("replicas") if isinstance(router, dict) else None
    how = Section("How this was measured").add(Bullets((
        f"policies, in the order they ran: {', '.join(runs) or 'none'}"
        + (f"; not run: {', '.join(f'{p} ({why})' for p, why in missing.items())}"
           if missing else ""),
        "each policy is a whole run in its own folder ("
        + ", ".join(a.run_id for a in analyses) + "), made through a vllm-router the bench "
        "started for it (retries off) in front of the same replicas"
        + (f" ({', '.join(map(str, replicas))})" if isinstance(replicas, list) else ""),
        "paired change = 100 x (arm - clean) / clean of the postfork marginal time within a "
        "block, median over the complete original blocks of that policy's run; clean and the "
        "arm of a block ran through the same router, so the change is the policy's own",
        "the policies ran one after another, not interleaved: a difference between two "
        "policies' changes also carries anything that drifted between the runs (other load, "
        "temperature); read it beside each change's interval",
        interval_line(first) if first else "no run to analyse",
    )))
    sections = [how, _change_section(runs)]
    for policy, analysis in runs.items():
        account = run_replica_account(analysis.records)
        section = Section(f"Replicas under {policy}")
        if account is None:
            section.add(Paragraph(f"{analysis.run_id}: no replica_metrics.jsonl lines, so no "
                                  "per-replica figures."))
        else:
            section.add(replica_table(account, caption_prefix=f"{analysis.run_id}. "))
        sections.append(section)
    return Document(f"Compaction under each routing policy: {base}", tuple(sections))


def _change_section(runs: Mapping[str, RunAnalysis]) -> Section:
    regimes = sorted({n for a in runs.values() for n in a.primary if n != POOLED},
                     key=regime_sort_key)
    arms = next(iter(runs.values())).arms if runs else ()
    rows = []
    for regime in regimes:
        for arm in arms:
            for policy, analysis in runs.items():
                comparison = analysis.primary.get(regime)
                rate = _rates(analysis).get((regime, arm))
                hits = (f"{MISSING} (no requests)", MISSING) if rate is None else (
                    rate_cell(rate.first), rate_cell(rate.later))
                if arm == REFERENCE_ARM:
                    clean = ("—" if comparison is None or comparison.clean_median_s is None
                             else f"reference: {CLEAN_CONTEXT} "
                             f"{comparison.clean_median_s:.1f} s (n={comparison.n_blocks})")
                    rows.append((regime, arm, policy, clean, "—", *hits))
                    continue
                found = None if comparison is None else comparison.arms.get(arm)
                change = "—" if found is None else change_cell(found.postfork, with_n=True)
                faster = "—" if found is None else f"{found.postfork.n_faster}/{found.postfork.n}"
                rows.append((regime, arm, policy, change, faster, *hits))
    return Section("Paired change vs clean and the continuation's cache, per policy").add(
        Table(("Regime", "Arm", "Policy", "Postfork time: change vs clean [95% CI]", "Faster",
               "Fork request: hit rate", "Later requests: hit rate"), tuple(rows),
              "Hit rate: sum cached / sum prompt tokens of the arm's own ok requests, as each "
              "response's usage reported them; the fork request is each attempt's first "
              "postfork request (where a rewrite breaks the cached prefix), later requests hit "
              "only where the router sent the agent back to the replica holding its prefix; "
              "n counts requests."))


def measured_only(records: RunRecords) -> RunRecords:
    """A sweep's records without its warm-up and drain continuations (bench/run/sweep.py: they
    ran on a cold cache or as the load fell, and are never planned), so each policy's paired
    change pairs only continuations that ran with all N agents active; other runs unchanged."""
    def measured(phase: object) -> bool:
        return phase in (None, "measured")

    if all(measured(a.sweep_phase) for a in records.arms):
        return records
    arms = tuple(a for a in records.arms if measured(a.sweep_phase))
    kept = {(a.regime, a.block) for a in arms}
    return dataclasses.replace(
        records, arms=arms,
        requests=tuple(r for r in records.requests if measured(r.labels.get("sweep_phase"))),
        blocks=tuple(b for b in records.blocks if (b.regime, b.block) in kept))


def write_routing(base: str, run_dirs: Mapping[str, Path], out: Path, *,
                  missing: Mapping[str, str] | None = None, seed: int = 0) -> str:
    """Analyse each policy's run folder (policy -> folder, in the order they ran), write the
    comparison's Markdown to `out` atomically and return it."""
    runs = {policy: analyze(measured_only(read_run(path)), seed=seed)
            for policy, path in run_dirs.items()}
    text = to_markdown(routing_document(base, runs, missing))
    write_text_atomic(out, text)
    return text


def compare_policies(base: str, run_dirs: Mapping[str, Path], missing: Mapping[str, str],
                     seed: int) -> tuple[Path, str]:
    """The bench's `Compare`: the comparison beside the runs (`routing_file`), written."""
    out = routing_file(next(iter(run_dirs.values())).parent, base)
    return out, write_routing(base, run_dirs, out, missing=missing, seed=seed)


def policies_of(analyses: Sequence[RunAnalysis]) -> list[str]:
    """Each run's routing policy as its manifest records it (its run id where none)."""
    return [_policy(a) for a in analyses]
