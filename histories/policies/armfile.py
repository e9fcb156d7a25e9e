"""Arm files: each arm's history at the fork, written by `make histories` beside `clean.json`
by one writer (`write_arm_files`), in which compaction is one more policy.

An arm file holds the history as the arm's policy would have sent it at the fork, built by the
arm's kind:
- compaction (`external`, `self`, `<compressor>-every-<n>`): every reasoning block up to the
  fork rewritten once by the compressor (`histories.compaction.arms.compaction_fork`); the
  provenance goes under `extra.provenance.compaction`, whose `totals` the bench charges to the
  arm as its one-time fork rewrite (bench/run/arm.py, `fork_rewrite_cost`);
- the second paper's policies (`entropy`, `step-entropy`, `delete-all-thinking`,
  `keep-latest`, `random-<r>`): the policy run online over the clean history up to and including
  the fork's turn (each step decided once, conditioned on the steps before it as already edited),
  exactly as before the first postfork request (`policy_fork`). The steps it decided are
  recorded as `settled`, so the continuation never decides them again; keep-latest leaves the
  fork's own turn (the latest) undecided, for the continuation. The provenance
  (`extra.provenance.policy`) records the rule, the scorer (model, device, limit, entropy
  implementation) or tokenizer, the seed, every decision (the ledger lines) and their totals;
  the bench charges the fork-time scorer seconds to the arm as its fork rewrite
  (`policy_fork_cost`), like a compressor's.
`clean` and `placebo` (clean's own file) and the replay-only `external-history` (the external
arm's file) need no file of their own and are skipped.

Whatever the kind, a file is written only when the arm's own problems are none (no compressor
or rule failure, no block the gate turns away) and its first postfork request differs from
clean's only in assistant reasoning; the invariant's report is kept in the provenance. Otherwise
the old file, if any, stays as it was. `rehearse` runs these checks where no model is at hand
(the import, before it prints the arms command), so an import never accepts a history whose
arms step would write nothing. Decisions and rewrites go to the task's ledger and
rewrite cache (`compaction/ledger.jsonl`, `compaction/cache.jsonl`), shared with acquisition
and continuation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.agent.continuation import check_reasoning_only, pending_observation
from compaction_bench.histories.compaction.arms import compaction_dir, compaction_fork
from compaction_bench.histories.compaction.compactor import CompactionCache, CompressorConfig
from compaction_bench.histories.compaction.judge import Gate, JudgeConfig
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import (
    History,
    load_history,
    message_action,
    save_history,
)
from compaction_bench.histories.format.importers.normalize import listed
from compaction_bench.histories.format.invariant import InvariantError, InvariantReport
from compaction_bench.histories.policies.registry import ArmSpec, parse_arm, stepwise_policy
from compaction_bench.histories.policies.rules import DeleteRule
from compaction_bench.histories.policies.scorer import ProxyScorer, ScorerConfig
from compaction_bench.histories.policies.stepwise import StepwisePolicy, edit_totals

TIMING_NOTE = ("online at the fork: each step decided once, before the request after it, from "
               "its reasoning and the history before it as already edited; never from its "
               "action's result or any later turn")


class PolicyArmError(SuiteError):
    """An arm file cannot be written or serve its policy (no compressor or scorer for it, not
    made from clean, written by something else)."""


@dataclass(frozen=True)
class ArmFileResult:
    """One arm of one task; `written` is False when `problems` kept the file from being
    (re)written. `history` is the arm's history either way; `blocks` the per-block provenance
    of a compaction arm (empty for the other policies); `totals` its provenance's totals."""

    arm: str
    path: Path
    written: bool
    history: History
    problems: list[str]
    invariant: InvariantReport | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    blocks: list[dict[str, Any]] = field(default_factory=list)


def write_arm_files(clean_path: str | Path, arms: Sequence[str], *,
                    compressors: Mapping[str, CompressorConfig] | None = None,
                    scorer: ScorerConfig | None = None, judge: JudgeConfig | None = None,
                    gate: Gate = "off", seed: int = 0, cache_path: str | Path | None = None,
                    ledger_path: str | Path | None = None,
                    clock: Clock = monotonic) -> list[ArmFileResult]:
    """Write `<arm>.json` beside `clean_path` for each arm name of `arms` (module docstring).

    `compressors` by compressor name (`{"external": ..., "self": ...}`) serve the compaction
    arms, `judge` and `gate` their fidelity check; `scorer` (its model also tokenizes) serves the
    second paper's arms, `seed` their random-r. The cache and ledger default to the task's
    `compaction/` folder. `clean_path` is never written.
    """
    clean_path = Path(clean_path)
    clean = load_history(clean_path)
    check_clean(clean, str(clean_path))
    cache = CompactionCache(cache_path or compaction_dir(clean_path) / "cache.jsonl")
    ledger = Ledger(ledger_path or compaction_dir(clean_path) / "ledger.jsonl")
    out = []
    for name in arms:
        spec = parse_arm(name)
        blocks: list[dict[str, Any]] = []
        if spec.kind == "compaction":
            config = (compressors or {}).get(str(spec.compressor))
            if config is None:
                raise PolicyArmError(f"arm {name}: no compressor '{spec.compressor}' given; "
                                     f"known: {', '.join(sorted(compressors or {})) or 'none'}")
            history, blocks, problems = compaction_fork(
                clean, name, config, cache=cache, ledger=ledger, judge=judge, gate=gate,
                clock=clock, every=spec.every)
            key = "compaction"
        elif spec.stepwise:
            if scorer is None:
                raise PolicyArmError(f"arm {name}: its policy needs a scorer config (the proxy "
                                     "model that scores or tokenizes); none was given")
            history, problems = policy_fork(clean, spec, scorer, ledger=ledger, seed=seed,
                                            clock=clock)
            key = "policy"
        else:
            continue  # no file of its own (module docstring)
        out.append(_check_and_write(clean, history, key, problems, blocks,
                                    clean_path.parent / f"{name}.json"))
    return out


def _check_and_write(clean: History, history: History, key: str, problems: list[str],
                     blocks: list[dict[str, Any]], path: Path) -> ArmFileResult:
    """The writer's part for every kind: the reasoning-only invariant, then the file if the arm
    has no problem at all."""
    problems = list(problems)
    report = None
    try:
        report = check_reasoning_only(clean, history)
        history.provenance[key]["invariant"] = report.to_json()
    except InvariantError as exc:
        problems.append(str(exc))
    if not problems:
        save_history(history, path)
    return ArmFileResult(arm=history.arm, path=path, written=not problems, history=history,
                         problems=problems, invariant=report,
                         totals=history.provenance[key].get("totals") or {}, blocks=blocks)


def check_clean(clean: History, origin: str) -> None:
    """The arms step's refusals of a history before any arm: arms are made from the clean arm,
    at a fork whose result was recorded (the result every arm is shown)."""
    if clean.arm != "clean":
        raise PolicyArmError(f"{origin}: arms are made from the clean arm, this is "
                             f"{clean.arm!r}")
    if clean.fork is None or clean.fork.pending_result is None:
        raise PolicyArmError(no_pending_result(clean, origin))


def rehearse(clean: History, origin: str) -> InvariantReport:
    """The arms step's checks of `clean`, run without a model, a scorer or a tokenizer, and
    without writing anything: `check_clean`, then the delete-all-thinking arm built as
    `write_arm_files` builds it (`policy_fork`'s policy run at the fork, then the writer's
    reasoning-only invariant), kept in memory. That arm edits every reasoning block up to and
    including the fork's, so a turn whose edited block cannot be put back (a text turn without
    exactly one action block) fails here as it fails for every policy arm. Raises
    `PolicyArmError` in one line: the file, the first failing message and field, the fix."""
    check_clean(clean, origin)
    policy = StepwisePolicy(DeleteRule(), name="delete-all-thinking",
                            reasoning_mode=clean.reasoning_mode, protocol=clean.action_protocol)
    sent = _at_fork(clean, policy)
    failed = [e for e in policy.edits if e.outcome == "failed"]
    if failed:
        raise PolicyArmError(_uneditable(clean, origin, failed[0].message_index,
                                         str(failed[0].error), len(failed), len(policy.edits)))
    arm = History(messages=sent, task=clean.task, arm=policy.name,
                  reasoning_mode=clean.reasoning_mode, action_protocol=clean.action_protocol,
                  fork=clean.fork, provenance=clean.provenance, tools=clean.tools)
    try:
        return check_reasoning_only(clean, arm)
    except InvariantError as exc:
        raise PolicyArmError(f"{origin}: {exc}; so `histories arms` would write no arm file: "
                             "import the log at another fork (fork=N)") from None


def _uneditable(clean: History, origin: str, index: int, error: str, failed: int,
                steps: int) -> str:
    """The refusal of a history whose reasoning a policy cannot edit in place, with its fix."""
    field_name = "reasoning" if clean.reasoning_mode == "native" else "content"
    before = [i for i, m in enumerate(clean.messages[:index])
              if message_action(m, clean.action_protocol) is not None]
    earlier = (f"import it with fork=N at an action before message {index} (turns with an "
               f"action there: {listed(before)}), or " if before and
               "recorded_pair" not in clean.provenance else "")
    return (f"{origin}: message {index}: field '{field_name}': a reasoning policy cannot edit "
            f"this turn ({error}); {failed} of the {steps} assistant turns up to the fork fail "
            f"so, and `histories arms` would write no arm file; fix: {earlier}give every "
            "assistant turn up to the fork exactly one action (one fenced ```bash block or one "
            "tool call)")


def _at_fork(clean: History, policy: StepwisePolicy) -> list[dict[str, Any]]:
    """`clean`'s messages as `policy` sends them in the first postfork request: every step up to
    and including the fork's turn decided once (module docstring)."""
    assert clean.fork is not None
    prefix = clean.messages[: clean.fork.message_index + 1]
    return policy.prepare([*prefix, pending_observation(clean)])[: len(prefix)]


def no_pending_result(clean: History, origin: str) -> str:
    """The refusal of a clean history whose fork has no recorded result, with its fix."""
    source = (clean.source or {}).get("path")
    if clean.fork is None:
        problem = "the history has no fork"
    else:
        problem = (f"the fork's action (message {clean.fork.message_index}) has no recorded "
                   "result, so no arm can be shown one")
    fix = (f"re-import it at an action whose result was recorded: `compaction-bench histories "
           f"import {source} {origin} --fork N` (without --fork the import picks the last one)"
           if source else "acquire it again (`make histories`)")
    return f"{origin}: field 'extra.fork.pending_result': {problem}; {fix}"


def policy_fork(clean: History, spec: ArmSpec, scorer: ScorerConfig, *,
                ledger: Ledger | None = None, seed: int = 0,
                clock: Clock = monotonic) -> tuple[History, list[str]]:
    """A second-paper arm of `clean` at the fork: (history, problems: failed decisions)."""
    if clean.fork is None or clean.fork.pending_result is None:
        raise PolicyArmError(no_pending_result(clean, f"task {clean.task}"))
    policy = stepwise_policy(spec, reasoning_mode=clean.reasoning_mode,
                             protocol=clean.action_protocol, scorer=scorer, seed=seed,
                             ledger=ledger, clock=clock,
                             context={"task": clean.task, "arm": spec.name, "phase": "fork"})
    sent = _at_fork(clean, policy)
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
    return history, problems


def _policy(history: History, origin: str) -> dict[str, Any]:
    found = history.provenance.get("policy")
    if not isinstance(found, dict) or found.get("arm") != history.arm:
        raise PolicyArmError(f"{origin}: arm {history.arm} has no policy provenance (not "
                             "written by `make histories`); write it with `compaction-bench "
                             f"histories arms --arms {history.arm}`")
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
