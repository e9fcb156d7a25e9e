"""Arm files of the second paper's policies, written by `make histories` beside `clean.json`.

An arm file holds the history as the arm's policy would have sent it at the fork: the policy is
run online over the clean history up to and including the fork's turn (each step decided once,
conditioned on the steps before it as already edited), exactly as before the first postfork
request. The steps it decided are recorded as `settled`, so the continuation never decides them
again; keep-latest leaves the fork's own turn (the latest) undecided, for the continuation.

Provenance (`extra.provenance.policy`) records the rule, the scorer (model, device, limit,
entropy implementation) or tokenizer, the seed, every decision (the ledger lines) and their
totals; the bench charges the fork-time scorer seconds to the arm as its fork-prefix rewrite
(`fork_rewrite_s`), like a compressor's. A file is written only when no decision failed and its
first postfork request differs from clean's only in assistant reasoning.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.agent.continuation import check_reasoning_only, pending_observation
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import History, load_history, save_history
from compaction_bench.histories.format.invariant import InvariantError, InvariantReport
from compaction_bench.histories.policies.registry import ArmSpec, parse_arm, stepwise_policy
from compaction_bench.histories.policies.scorer import ProxyScorer, ScorerConfig
from compaction_bench.histories.policies.stepwise import edit_totals

TIMING_NOTE = ("online at the fork: each step decided once, before the request after it, from "
               "its reasoning and the history before it as already edited; never from its "
               "action's result or any later turn")


class PolicyArmError(SuiteError):
    """An arm file cannot serve its policy (written by something else, or without a scorer)."""


@dataclass(frozen=True)
class PolicyArmResult:
    """One arm of one task; `written` is False when `problems` kept the file from being written."""

    arm: str
    path: Path
    written: bool
    history: History
    problems: list[str]
    invariant: InvariantReport | None = None
    totals: dict[str, Any] = field(default_factory=dict)


def make_policy_arm(clean: History, spec: ArmSpec, scorer: ScorerConfig, *, path: Path,
                    ledger: Ledger | None = None, seed: int = 0,
                    clock: Clock = monotonic) -> PolicyArmResult:
    """Build one second-paper arm from `clean`, check it, write it to `path` if it passes."""
    if clean.fork is None or clean.fork.pending_result is None:
        raise PolicyArmError(f"task {clean.task}: the clean history has no fork with a pending "
                             "result; acquire it first (`make histories`)")
    policy = stepwise_policy(spec, reasoning_mode=clean.reasoning_mode,
                             protocol=clean.action_protocol, scorer=scorer, seed=seed,
                             ledger=ledger, clock=clock,
                             context={"task": clean.task, "arm": spec.name, "phase": "fork"})
    prefix = clean.messages[: clean.fork.message_index + 1]
    sent = policy.prepare([*prefix, pending_observation(clean)])[: len(prefix)]
    loaded = ProxyScorer.shared(scorer).describe() if spec.needs_scorer else None
    edits = [{k: v for k, v in e.to_json().items() if k != "context"} for e in policy.edits]
    history = History(
        messages=copy.deepcopy(sent), task=clean.task, arm=spec.name,
        reasoning_mode=clean.reasoning_mode, action_protocol=clean.action_protocol,
        fork=copy.deepcopy(clean.fork), info=copy.deepcopy(clean.info),
        provenance={
            **copy.deepcopy(clean.provenance),
            "derived_from": {"arm": clean.arm, "content_sha256": clean.content_hash()},
            "policy": {"arm": spec.name, "rule": policy.rule.rule, "timing": TIMING_NOTE,
                       "scorer_config": scorer.model_dump(mode="json"), "scorer": loaded,
                       "seed": seed, "settled": policy.decided, "edits": edits,
                       "totals": edit_totals(policy.edits)},
        },
        source=copy.deepcopy(clean.source), tools=copy.deepcopy(clean.tools), continuation=[])
    problems = [f"message {e.message_index}: {e.error}" for e in policy.edits
                if e.outcome == "failed"]
    report = None
    try:
        report = check_reasoning_only(clean, history)
        history.provenance["policy"]["invariant"] = report.to_json()
    except InvariantError as exc:
        problems.append(str(exc))
    if not problems:
        save_history(history, path)
    return PolicyArmResult(arm=spec.name, path=path, written=not problems, history=history,
                           problems=problems, invariant=report,
                           totals=history.provenance["policy"]["totals"])


def write_policy_arms(clean_path: str | Path, arms: Sequence[str], scorer: ScorerConfig, *,
                      ledger_path: str | Path | None = None, seed: int = 0,
                      clock: Clock = monotonic) -> list[PolicyArmResult]:
    """Write `<arm>.json` beside `clean_path` for each second-paper arm in `arms`; decisions
    go to the task's ledger (`compaction/ledger.jsonl`, shared with compaction)."""
    clean_path = Path(clean_path)
    clean = load_history(clean_path)
    if clean.arm != "clean":
        raise PolicyArmError(f"{clean_path}: arms are made from the clean arm, this is "
                             f"{clean.arm!r}")
    ledger = Ledger(ledger_path or clean_path.parent / "compaction" / "ledger.jsonl")
    out = []
    for name in arms:
        spec = parse_arm(name)
        if not spec.stepwise:
            raise PolicyArmError(f"arm {name} is not a second-paper policy (its file is written "
                                 "by compaction or is clean itself)")
        out.append(make_policy_arm(clean, spec, scorer, path=clean_path.parent / f"{name}.json",
                                   ledger=ledger, seed=seed, clock=clock))
    return out


def _policy(history: History, origin: str) -> dict[str, Any]:
    found = history.provenance.get("policy")
    if not isinstance(found, dict) or found.get("arm") != history.arm:
        raise PolicyArmError(f"{origin}: arm {history.arm} has no policy provenance (not "
                             "written by `make histories`); write it with `python -m "
                             f"histories.cli arms --arms {history.arm}`")
    return found


def scorer_of(history: History, origin: str = "arm file") -> ScorerConfig:
    """The scorer the arm file was written with: its continuation scores with the same one."""
    found = _policy(history, origin).get("scorer_config")
    if not isinstance(found, dict):
        raise PolicyArmError(f"{origin}: arm {history.arm} records no scorer_config; write it "
                             "again with `make histories`")
    return ScorerConfig.model_validate(found)


def settled_of(history: History, origin: str = "arm file") -> list[int]:
    """The message indices the arm file's policy already decided at the fork."""
    return [int(i) for i in _policy(history, origin).get("settled") or []]


def policy_fork_cost(history: History) -> dict[str, Any]:
    """The fork-time decisions' cost in the bench's fork-rewrite fields: scorer seconds, scorer
    calls (as requests) and scorer input tokens (as prompt tokens; a scorer generates none)."""
    totals = (history.provenance.get("policy") or {}).get("totals") or {}
    if not totals:
        return {}
    return {"fork_rewrite_s": float(totals.get("scorer_s") or 0.0),
            "fork_rewrite_requests": int(totals.get("scorer_calls") or 0),
            "fork_rewrite_prompt_tokens": int(totals.get("scorer_tokens") or 0),
            "fork_rewrite_completion_tokens": 0, "fork_rewrite_cache_hits": 0}
