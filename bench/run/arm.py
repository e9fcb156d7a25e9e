"""Arms ready to run in a block: the history each arm continues from, a fresh history policy per
attempt, what the arm's file says its fork-prefix compaction cost, and the reasoning-only
invariant on the exact first request each attempt will send."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.agent.continuation import first_request
from compaction_bench.histories.compaction.compactor import CompactionCache, CompressorConfig
from compaction_bench.histories.compaction.endpoint import RecordSink
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import History
from compaction_bench.histories.format.invariant import InvariantError, compare_bodies
from compaction_bench.histories.policies.base import CleanPolicy, HistoryPolicy
from compaction_bench.histories.policies.compacting import policy_for
from compaction_bench.histories.policies.inline import (
    InlineCompaction,
    check_replaced,
    check_tail,
)
from compaction_bench.histories.policies.registry import ArmSpec, arm_kind, parse_arm
from compaction_bench.histories.tasks.task import Task
from compaction_bench.loadgen.replay import ReplayPlan, ReplaySettings, first_body
from compaction_bench.serve.engines import vllm_wire as dialect

# Fields a request body may differ in between arms because the run set them on purpose (a
# recorded factor), not because a policy touched the history: the per-arm cache salt (CACHE=
# isolated) and the per-arm sampling seed (SEEDS=independent).
FACTOR_FIELDS = (dialect.CACHE_SALT, "seed")
# Replay forces each arm's own recorded output length: the recorded behaviour, not the history.
REPLAY_FACTOR_FIELDS = (*FACTOR_FIELDS, "max_tokens", "min_tokens")


class ArmError(SuiteError):
    """An arm cannot be set up (no compressor for it, no clean history to check against)."""


@dataclass(frozen=True)
class AttemptContext:
    """Where one attempt of an arm runs: its block and attempt, its sampling seed, and where its
    policy records compressor requests and rewrites."""

    regime: str
    block: int
    attempt: str
    seed: int
    ledger: Ledger
    on_record: RecordSink | None = None
    origin_s: float = 0.0
    record: str | None = None  # replay: the source this block replays


@dataclass(frozen=True)
class Arm:
    """What an arm continues from and how it treats its history on the way."""

    name: str
    history: History
    new_policy: Callable[[AttemptContext], HistoryPolicy]  # a fresh policy per attempt
    fork_rewrite: Mapping[str, Any] = field(default_factory=dict)  # the arm file's T_R
    # replay (bench/run/replay.py): the recorded turns it sends, per replay source; None: a live
    # agent continues `history`
    replay: Mapping[str, ReplayPlan] | None = None


def fork_rewrite_cost(history: History) -> dict[str, Any]:
    """The one-time compaction of the fork prefix as the arm file recorded it (the study's
    T_R): seconds in compressor requests, requests (drafts), tokens, and cache hits (blocks
    that cost nothing because a cache already had them)."""
    totals = (history.provenance.get("compaction") or {}).get("totals") or {}
    if not totals:
        return {}
    return {"fork_rewrite_s": float(totals.get("latency_s") or 0.0),
            "fork_rewrite_requests": int(totals.get("drafts") or 0),
            "fork_rewrite_prompt_tokens": totals.get("prompt_tokens"),
            "fork_rewrite_completion_tokens": totals.get("completion_tokens"),
            "fork_rewrite_cache_hits": int(totals.get("cache_hits") or 0)}


def arm_for(name: str, history: History, *, compressors: Mapping[str, CompressorConfig],
            cache: CompactionCache | None = None,
            before_request: Callable[[], None] | None = None) -> Arm:
    """The arm an `ARMS=` name runs (`histories.policies.registry`).

    `clean` and `placebo` send their history unchanged (placebo is clean's very file under
    another name). A compaction arm (`external`, `self`, `self-every-3`) continues its own arm
    file and compacts new reasoning blocks before every request (or every n turns) with its
    compressor; `cache` (a persistent rewrite cache) only where the run asks to reuse rewrites,
    by default every attempt pays its own; `before_request` runs before each compressor request
    (a compressor started on first use). A second-paper arm (`entropy`, `step-entropy`,
    `delete-all-thinking`, `keep-latest`, `random-30`) continues its own arm file with its
    stepwise policy, scoring with the scorer the file was written with; the file's fork-time
    scorer cost is the arm's fork rewrite."""
    spec = parse_arm(name)
    if spec.kind == "reference":
        return Arm(name=name, history=history, new_policy=lambda _: CleanPolicy())
    if spec.kind == "inline":
        return _inline_arm(name, history)
    if spec.kind != "compaction":
        return _stepwise_arm(spec, history)
    assert spec.compressor is not None
    if spec.compressor not in compressors:
        raise ArmError(f"arm '{name}' has no compressor '{spec.compressor}' configured; known: "
                       f"{', '.join(sorted(compressors)) or 'none'}")
    config = compressors[spec.compressor]

    def new_policy(context: AttemptContext) -> HistoryPolicy:
        return policy_for(history, config, name=name, cache=cache, ledger=context.ledger,
                          context={"regime": context.regime, "block": context.block,
                                   "attempt": context.attempt},
                          on_record=context.on_record, origin_s=context.origin_s,
                          seed=context.seed, before_request=before_request, every=spec.every)

    return Arm(name=name, history=history, new_policy=new_policy,
               fork_rewrite=fork_rewrite_cost(history))


def _inline_arm(name: str, history: History) -> Arm:
    """`self-inline`: clean's own history, compacted in context once at the fork by the target
    itself (histories/policies/inline.py); its compaction request is its whole rewrite cost."""
    if history.arm != "clean" or history.fork is None:
        raise ArmError(f"arm {name} continues clean's history (task {history.task}), not "
                       f"{history.arm!r}, and needs its fork")
    fork = history.fork.message_index

    def new_policy(context: AttemptContext) -> HistoryPolicy:
        return InlineCompaction(name=name, fork_index=fork, on_record=context.on_record)

    return Arm(name=name, history=history, new_policy=new_policy)


def _stepwise_arm(spec: ArmSpec, history: History) -> Arm:
    from compaction_bench.histories.policies.armfile import policy_fork_cost, scorer_of, settled_of
    from compaction_bench.histories.policies.registry import stepwise_policy

    origin = f"arm file of {spec.name} (task {history.task})"
    if history.arm != spec.name:
        raise ArmError(f"{origin}: the file is arm {history.arm!r}, not {spec.name!r}; write it "
                       f"with `compaction-bench histories arms --arms {spec.name}`")
    scorer, settled = scorer_of(history, origin), settled_of(history, origin)

    def new_policy(context: AttemptContext) -> HistoryPolicy:
        return stepwise_policy(spec, reasoning_mode=history.reasoning_mode,
                               protocol=history.action_protocol, scorer=scorer,
                               seed=context.seed, settled=settled, ledger=context.ledger,
                               context={"regime": context.regime, "block": context.block,
                                        "attempt": context.attempt, "task": history.task,
                                        "arm": spec.name, "phase": "continuation"},
                               origin_s=context.origin_s)

    return Arm(name=spec.name, history=history, new_policy=new_policy,
               fork_rewrite=policy_fork_cost(history))


@dataclass(frozen=True)
class WireCheck:
    """The invariant for one attempt: the exact body its first request will carry, and how it
    compares with clean's. `error` is set when it differs outside reasoning."""

    sha256: str
    report: dict[str, Any]
    error: str | None
    # a check of the first body really sent, where it could not be known before the run (an
    # in-context compaction's summary): the error, or None
    after: Callable[[bytes], str | None] | None = None


def check_on_the_wire(arm: Arm, arm_config: ChatModelConfig, clean: Arm,
                      clean_config: ChatModelConfig, task: Task,
                      context: AttemptContext) -> WireCheck:
    """Build the first postfork request of `arm` and of `clean` exactly as their attempts will
    send them (real settings, seeds, salts, a fresh policy each) and compare them field by
    field; only assistant reasoning and the recorded factor fields may differ."""
    sent_arm = first_request(arm.history, arm_config, task=task, policy=arm.new_policy(context))
    sent_clean = first_request(clean.history, clean_config, task=task,
                               policy=clean.new_policy(context))
    body_arm, body_clean = json.loads(sent_arm.body), json.loads(sent_clean.body)
    if arm_kind(arm.name) == "inline":
        return _inline_check(arm, body_arm, body_clean, sent_clean.body_sha256)
    factors = sorted(k for k in FACTOR_FIELDS if body_arm.get(k) != body_clean.get(k))
    for key in factors:
        body_arm.pop(key, None)
        body_clean.pop(key, None)
    report: dict[str, Any] = {"clean_sha256": sent_clean.body_sha256,
                              "arm_sha256": sent_arm.body_sha256, "factor_fields": factors}
    if clean.history.fork is not None and arm.history.fork is not None and (
            clean.history.fork.action != arm.history.fork.action):
        return WireCheck(sent_arm.body_sha256, {**report, "passed": False},
                         f"InvariantError: arm {arm.name}: the fork's pending action differs "
                         "from clean's (extra.fork.action)")
    try:
        checked = compare_bodies(body_clean, body_arm, arm_name=arm.name, task=task.id,
                                 reasoning_mode=clean.history.reasoning_mode,
                                 protocol=clean.history.action_protocol)
    except InvariantError as exc:
        return WireCheck(sent_arm.body_sha256, {**report, "passed": False},
                         f"InvariantError: {exc}")
    return WireCheck(sent_arm.body_sha256, {
        **report, "passed": True, "reasoning_fields": checked.reasoning_fields,
        "identical": not checked.reasoning_fields}, None)


def _inline_check(arm: Arm, body_arm: dict[str, Any], body_clean: dict[str, Any],
                  clean_sha256: str) -> WireCheck:
    """An in-context compaction's invariant (`check_replaced`): before the block, on its first
    request with the summary's place held; after the run, on the request it really sent."""
    assert arm.history.fork is not None
    fork = arm.history.fork.message_index

    def check(body: dict[str, Any]) -> dict[str, Any]:
        return check_replaced(body_clean, body, arm_name=arm.name, fork_index=fork,
                              ignore=FACTOR_FIELDS)

    def after(sent: bytes) -> str | None:
        try:
            check(json.loads(sent))
        except InvariantError as exc:
            return f"InvariantError: the first request sent: {exc}"
        return None

    report: dict[str, Any] = {"clean_sha256": clean_sha256, "in_context_compaction": True}
    try:
        report.update(check(body_arm))
    except InvariantError as exc:
        return WireCheck("", {**report, "passed": False}, f"InvariantError: {exc}")
    report.pop("summary_chars", None)  # the placeholder's, not a summary's
    return WireCheck("", report, None, after=after)


def check_replay_on_the_wire(arm: Arm, arm_settings: ReplaySettings, clean: Arm,
                             clean_settings: ReplaySettings, context: AttemptContext
                             ) -> WireCheck:
    """The invariant for a replay attempt: the first request `arm` will send for the block's
    source against clean's, as bytes on the wire. Only assistant reasoning (the field, or the
    inlined thought where the model has no field) and the recorded factors may differ; the
    report says whether nothing differs at all (`identical`: nothing was compacted)."""
    from compaction_bench.loadgen.replay import compare_wire

    assert arm.replay is not None and clean.replay is not None and context.record is not None
    plan, reference = arm.replay[context.record], clean.replay[context.record]
    sent_arm = first_body(plan, arm_settings, arm.new_policy(context))
    sent_clean = first_body(reference, clean_settings, clean.new_policy(context))
    body_arm, body_clean = json.loads(sent_arm), json.loads(sent_clean)
    factors = sorted(k for k in REPLAY_FACTOR_FIELDS if body_arm.get(k) != body_clean.get(k))
    for key in factors:
        body_arm.pop(key, None)
        body_clean.pop(key, None)
    arm_sha = hashlib.sha256(sent_arm).hexdigest()
    report: dict[str, Any] = {"clean_sha256": hashlib.sha256(sent_clean).hexdigest(),
                              "arm_sha256": arm_sha, "factor_fields": factors}
    if arm_kind(arm.name) == "recorded":
        try:
            found = check_tail(body_clean, body_arm, arm_name=arm.name)
        except InvariantError as exc:
            return WireCheck(arm_sha, {**report, "passed": False}, f"InvariantError: {exc}")
        return WireCheck(arm_sha, {**report, **found, "agents_own_compaction": True}, None)
    try:
        fields = compare_wire(body_clean, body_arm, arm_name=arm.name, source=context.record)
    except InvariantError as exc:
        return WireCheck(arm_sha, {**report, "passed": False}, f"InvariantError: {exc}")
    return WireCheck(arm_sha, {**report, "passed": True, "reasoning_fields": fields,
                               "identical": not fields}, None)
