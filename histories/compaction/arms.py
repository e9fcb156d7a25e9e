"""Arms from a clean history: `external` and `self` (or any named compressor) at the fork.

Timing, as the study's outcome-blind protocol has it: every block is rewritten after its action
was requested and before that action's result exists for the compressor. Writing arms from a
saved clean history keeps that, because a rewrite's input is the block and its action name
only: the compressor never receives an observation, the pending result or any later turn, so the
record is what it would have been had it been made in the agent loop at that moment (the cache,
shared with acquisition and continuation, makes them literally the same record).

An arm is written (`<arm>.json` beside `clean.json`) only when every block settled (no
compressor failure), its first postfork request passes the reasoning-only invariant and the gate
lets it through. Otherwise the old file, if any, stays as it was; the ledger and the cache keep
every block that did settle, so a rerun only redoes the failures.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.agent.continuation import check_reasoning_only
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
from compaction_bench.histories.format.history import History, load_history, save_history
from compaction_bench.histories.format.invariant import InvariantError, InvariantReport

SEED_ARMS = ("external", "self")
TIMING_NOTE = ("at the fork: each block rewritten from (block, requested action name) only, "
               "after its action was requested and before any result reached the compressor")


def compaction_dir(clean_path: str | Path) -> Path:
    """Where a task's rewrite cache and ledger live: `<task>/compaction/` beside clean.json."""
    return Path(clean_path).parent / "compaction"


@dataclass(frozen=True)
class ArmResult:
    """One arm of one task. `written` is False when `problems` kept the arm file from being
    (re)written; `history` is the compacted history either way (None if it could not be built)."""

    arm: str
    path: Path
    written: bool
    history: History | None
    blocks: list[dict[str, Any]]
    problems: list[str]
    invariant: InvariantReport | None = None
    totals: dict[str, Any] = field(default_factory=dict)


def totals(results: list[CompactionResult]) -> dict[str, Any]:
    """Per-arm sums over its blocks: counts per outcome, words, rewrite time, tokens, cost."""
    out: dict[str, Any] = {"blocks": len(results)}
    out.update({o: sum(r.outcome == o for r in results) for o in OUTCOMES})
    for name in ("words_in", "words_out", "latency_s", "drafts", "redactions"):
        out[name] = sum(getattr(r, name) for r in results)
    for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cost"):
        values = [getattr(r, name) for r in results if getattr(r, name) is not None]
        out[name] = sum(values) if values else None
    out["cache_hits"] = sum(r.cache_hit for r in results)
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


def make_arm(clean: History, arm: str, config: CompressorConfig, *, path: Path,
             cache: CompactionCache, ledger: Ledger, judge: JudgeConfig | None = None,
             gate: Gate = "off", clock: Clock = monotonic, every: int = 1) -> ArmResult:
    """Build one arm, check it, and write it to `path` only if it passes everything."""
    compactor = Compactor(config, cache=cache, ledger=ledger, clock=clock)
    history, blocks, results = compact_history(clean, compactor, arm, judge=judge, clock=clock,
                                               every=every)
    problems = [f"message {b['message_index']}: compressor failed: {b['error']}"
                for b in blocks if b["outcome"] == "failed"]
    report = None
    try:
        report = check_reasoning_only(clean, history)
    except InvariantError as exc:
        problems.append(str(exc))
    problems += gate_failures(blocks, gate)
    if report is not None:
        history.provenance["compaction"]["invariant"] = report.to_json()
        history.provenance["compaction"]["gate"] = gate
    if not problems:
        save_history(history, path)
    return ArmResult(arm=arm, path=path, written=not problems, history=history, blocks=blocks,
                     problems=problems, invariant=report, totals=totals(results))


def write_arms(clean_path: str | Path, compressors: Mapping[str, CompressorConfig], *,
               cache_path: str | Path | None = None, ledger_path: str | Path | None = None,
               judge: JudgeConfig | None = None, gate: Gate = "off",
               clock: Clock = monotonic, cadence: Mapping[str, int] | None = None
               ) -> list[ArmResult]:
    """Write `<arm>.json` beside `clean_path` for each (arm name, compressor), e.g.
    `{"external": external_compressor(url), "self": self_compressor(target_url)}`;
    `cadence` gives an arm's compaction interval in turns (`{"self-every-3": 3}`), default 1.

    The cache (`compaction/cache.jsonl`) and ledger (`compaction/ledger.jsonl`) default to the
    task's folder, so acquisition, arm writing and continuation share them. `clean_path` is
    never written.
    """
    clean_path = Path(clean_path)
    clean = load_history(clean_path)
    if clean.arm != "clean":
        raise ValueError(f"{clean_path}: arms are made from the clean arm, this is "
                         f"{clean.arm!r}")
    cache = CompactionCache(cache_path or compaction_dir(clean_path) / "cache.jsonl")
    ledger = Ledger(ledger_path or compaction_dir(clean_path) / "ledger.jsonl")
    return [make_arm(clean, arm, config, path=clean_path.parent / f"{arm}.json", cache=cache,
                     ledger=ledger, judge=judge, gate=gate, clock=clock,
                     every=(cadence or {}).get(arm, 1))
            for arm, config in compressors.items()]
