"""Compaction at the fork: the `external` and `self` arms (or any named compressor, and their
`-every-<n>` cadences) built from a clean history. The arm file itself is written by the one
arm-file writer (`histories.policies.armfile.write_arm_files`), in which compaction is one more
policy; this module is what that writer calls for a compaction arm (`compaction_fork`).

Timing, as the study's outcome-blind protocol has it: every block is rewritten after its action
was requested and before that action's result exists for the compressor. Building arms from a
saved clean history keeps that, because a rewrite's input is the block and its action name
only: the compressor never receives an observation, the pending result or any later turn, so the
record is what it would have been had it been made in the agent loop at that moment (the cache,
shared with acquisition and continuation, makes them literally the same record).

A compaction arm's problems, besides the writer's reasoning-only invariant: a block the
compressor failed on, and a block the fidelity gate turns away. The ledger and the cache keep
every block that did settle, so a rerun only redoes the failures.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.compactor import (
    CompactionCache,
    CompactionResult,
    Compactor,
    CompressorConfig,
    compact_message,
)
from compaction_bench.histories.compaction.judge import (
    Gate,
    JudgeConfig,
    gate_failures,
    judge_block,
    tool_call_text,
)
from compaction_bench.histories.compaction.ledger import OUTCOMES, Ledger
from compaction_bench.histories.compaction.lexical import lexical_diagnostics
from compaction_bench.histories.format.history import History

if TYPE_CHECKING:
    pass

SEED_ARMS = ("external", "self")
TIMING_NOTE = ("at the fork: each block rewritten from (block, requested action name) only, "
               "after its action was requested and before any result reached the compressor")


def compaction_dir(clean_path: str | Path) -> Path:
    """Where a task's rewrite cache and ledger live: `<task>/compaction/` beside clean.json."""
    return Path(clean_path).parent / "compaction"


_COST = ("latency_s", "drafts", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost")


def measured(result: CompactionResult, name: str) -> Any:
    """One block's measured rewrite cost `name`: this call's, or on a cache hit the cost
    measured when the entry was made."""
    return (result.cached or {}).get(name) if result.cache_hit else getattr(result, name)


def totals(results: list[CompactionResult]) -> dict[str, Any]:
    """Per-arm sums over its blocks: counts per outcome, words, rewrite time, tokens, cost.

    The rewrite cost (`latency_s`, `drafts`, tokens, `cost`: the arm's T_R, which the bench
    charges as its fork rewrite) counts every block's measured cost, a cache hit's as measured
    when its entry was made: an arm written from another arm's rewrites (`self-every-3` after
    `self`) costs what rewriting its blocks cost, not 0. `from_cache` says how much of it was
    measured earlier and `live_latency_s` what this writing itself spent."""
    out: dict[str, Any] = {"blocks": len(results)}
    out.update({o: sum(r.outcome == o for r in results) for o in OUTCOMES})
    for name in ("words_in", "words_out", "redactions"):
        out[name] = sum(getattr(r, name) for r in results)
    hits = [r for r in results if r.cache_hit]
    for name, chosen in (("all", results), ("hits", hits)):
        sums: dict[str, Any] = {}
        for cost in _COST:
            values = [measured(r, cost) for r in chosen if measured(r, cost) is not None]
            sums[cost] = sum(values) if values else (
                None if cost not in ("latency_s", "drafts") else 0)
        if name == "all":
            out.update(sums)
        else:
            stamps = [float(r.cached["at"]) for r in hits if r.cached and r.cached.get("at")]
            out["from_cache"] = {"blocks": len(hits), **sums,
                                 "measured_at": [min(stamps), max(stamps)] if stamps else None}
    out["live_latency_s"] = sum(r.latency_s for r in results)
    out["cache_hits"] = len(hits)
    return out


def compact_history(clean: History, compactor: Compactor, arm: str, *,
                    judge: JudgeConfig | None = None, clock: Clock = monotonic,
                    every: int = 1) -> tuple[History, list[dict[str, Any]],
                                             list[CompactionResult]]:
    """The arm `arm` of `clean`: every nonempty assistant reasoning block up to and including
    the fork's compacted; everything else the very same. Returns (history, per-block provenance
    entries, results). Never raises for compressor trouble: failed blocks stay raw. With a
    cadence (`every` > 1) only the blocks of turns up to the last multiple of `every` are
    compacted: the state the `<compressor>-every-<n>` arm has at the fork."""
    if clean.fork is None:
        raise ValueError(f"task {clean.task}: the clean history has no fork; acquire it first")
    messages: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    results: list[CompactionResult] = []
    turns = sum(m.get("role") == "assistant" for m in clean.messages)
    compacted_turns, turn = turns // every * every, 0
    for index, message in enumerate(clean.messages):
        if message.get("role") != "assistant":
            messages.append(message)
            continue
        turn += 1
        if turn > compacted_turns:  # after the cadence's last compaction before the fork
            messages.append(message)
            continue
        context = {"task": clean.task, "arm": arm, "message_index": index, "phase": "fork"}
        new, result = compact_message(compactor, message, clean.reasoning_mode,
                                      clean.action_protocol, context=context)
        messages.append(new)
        if result is None:
            continue
        results.append(result)
        entry: dict[str, Any] = {"message_index": index, **result.provenance()}
        if result.outcome == "rewritten":
            entry["lexical"] = asdict(lexical_diagnostics(result.raw, result.record))
            if judge is not None:
                entry["judge"] = judge_block(result.raw, result.record,
                                             tool_call_text(message, clean.action_protocol),
                                             judge, clock=clock).to_json()
        blocks.append(entry)
    history = History(
        messages=copy.deepcopy(messages), task=clean.task, arm=arm,
        reasoning_mode=clean.reasoning_mode, action_protocol=clean.action_protocol,
        fork=copy.deepcopy(clean.fork), info=copy.deepcopy(clean.info),
        provenance={
            **copy.deepcopy(clean.provenance),
            "derived_from": {"arm": clean.arm, "content_sha256": clean.content_hash()},
            "compaction": {"compressor": compactor.describe(), "timing": TIMING_NOTE,
                           **({"every": every} if every > 1 else {}),
                           "compressor_inputs": ["reasoning block", "requested action name"],
                           "blocks": blocks, "totals": totals(results),
                           "judge": judge.model_dump(mode="json") if judge else None},
        },
        source=copy.deepcopy(clean.source), tools=copy.deepcopy(clean.tools), continuation=[])
    return history, blocks, results


def compaction_fork(clean: History, arm: str, config: CompressorConfig, *,
                    cache: CompactionCache, ledger: Ledger, judge: JudgeConfig | None = None,
                    gate: Gate = "off", clock: Clock = monotonic, every: int = 1
                    ) -> tuple[History, list[dict[str, Any]], list[str]]:
    """The compaction arm `arm` of `clean` at the fork: (history, per-block provenance entries,
    problems: compressor failures and blocks the gate turns away)."""
    compactor = Compactor(config, cache=cache, ledger=ledger, clock=clock)
    history, blocks, _ = compact_history(clean, compactor, arm, judge=judge, clock=clock,
                                         every=every)
    problems = [f"message {b['message_index']}: compressor failed: {b['error']}"
                for b in blocks if b["outcome"] == "failed"]
    problems += gate_failures(blocks, gate)
    history.provenance["compaction"]["gate"] = gate
    return history, blocks, problems
