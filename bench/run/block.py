"""One block: every arm of one task continued side by side, one experimental client per arm.

Order of events in a block:
1. the arms' start order is drawn from the block's seeded generator and recorded (with
   SIDE_BY_SIDE=0 the arms then run one after another in that order, each alone);
2. each attempt gets its sampling seed (common or per arm), its cache salt (isolated cache) and
   a fresh policy, and the first request it will send is built and checked against clean's on
   the wire (the reasoning-only invariant): clean among the block's arms, else the `reference`
   the caller passes (a recovery run, a sweep cell: one arm alone); without either the record
   says the invariant was not checked, never that it passed;
3. every arm sets up (workspace copy, replay of the history's actions) in its own thread and
   waits; when all are ready they are released together, in the recorded order, and each arm's
   actual first-request time is recorded;
4. each arm's outcome becomes one `ArmRecord`, whatever went wrong inside it: a failing arm
   keeps its record and its duration. The protocol check fails an arm whose continuation failed,
   whose invariant failed, whose first request on the wire differs from the one checked, whose
   policy could not apply (compressor down, every draft rejected), or (strict protocol) which
   made a protocol error after the fork.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction_bench.bench.run.arm import Arm, AttemptContext, WireCheck
from compaction_bench.bench.run.config import (
    REFERENCE,
    SEARCH,
    SWEEP,
    BenchConfig,
    arm_seed,
    cache_salt,
    continuation_of,
)
from compaction_bench.bench.run.source import Attempt, Result, Source
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.agent.chat import ChatModelConfig
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.loadgen.replay import REPLAYED, ReplayResult
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.request import PreparedRequest, RequestRecord

# mini-swe-agent's terminal statuses: reaching one of them (without a transport error) is
# protocol completion under the lenient protocol.
TERMINAL = frozenset({"Submitted", "LimitsExceeded", "RepeatedFormatError", "TimeExceeded",
                      REPLAYED})
SETUP_TIMEOUT_S = 900.0  # the longest the released arms wait for a sibling's setup
NO_CLEAN = "not checked (no clean in this run)"


def not_checked() -> WireCheck:
    """The invariant of an attempt with no clean arm to compare with: recorded as unchecked
    (`passed` null), so nothing reads it as held."""
    return WireCheck("", {"passed": None, "checked": False, "not_checked": NO_CLEAN}, None)


@dataclass(frozen=True)
class BlockSettings:
    """What every block of a run shares."""

    config: BenchConfig
    run_id: str
    source: Source  # where the run's continuations come from (bench/run/source.py)
    model: ChatModelConfig
    protocol: str  # strict | lenient
    block_size: int  # the server's KV block size (tokens), for the fork cache state
    ledger: Ledger
    # CACHE=run: the run's one cache salt, unique to this run (a rerun under the same RUN_ID
    # must not find the earlier run's blocks) and kept on RESUME; None: the run id
    run_salt: str | None = None
    # replay: the recordings blocks take in turn
    records: tuple[str, ...] = ()
    # the names the run's server answers as (its profile's served names and the model asked
    # for): a response naming another fails its arm (empty: not checked)
    served_names: tuple[str, ...] = ()

    def record_for(self, block: int) -> str | None:
        """The recording block `block` replays (None for agents): the records in turn, by the
        block's position in its run under REPEAT; in a sweep or a search, continuation k of
        agent i replays record i + k, so the agents of a fleet replay different recordings at
        once, as a real fleet's agents work on different tasks, and as the fleet model draws
        its traces per agent. (Until 2026-12-07 every agent of a level replayed the same
        recording in lockstep.)"""
        if not self.records:
            return None
        if self.config.regime in (SWEEP, SEARCH):
            _, agent, index = continuation_of(block)
            return self.records[(agent + index) % len(self.records)]
        position = self.config.position(block)
        return self.records[(position - 1) % len(self.records)]


@dataclass(frozen=True)
class BlockOutcome:
    records: list[ArmRecord]
    order: tuple[str, ...]
    seed: int
    started_s: float
    released_s: float | None
    ended_s: float
    block_pass: int = 1
    record: str | None = None  # replay: the source the block replayed


def cache_state(prompt: int | None, cached: int | None, block_size: int) -> str | None:
    """cold: nothing cached; warm: all but the last partial KV block cached; partial between."""
    if prompt is None or cached is None:
        return None
    if cached <= 0:
        return "cold"
    return "warm" if cached >= prompt - block_size else "partial"


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def protocol_error(arm: Arm, result: Result, wire: WireCheck, policy: HistoryPolicy,
                   protocol: str, served: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
    """(error, phase) of the protocol check, or (None, None) when the arm passes. `served`:
    the names the run's server answers as (empty: not checked)."""
    if result.error is not None:
        return result.error, result.error_phase
    if wrong := wrong_model(result.requests, served):
        return wrong, "run"
    if wire.error is not None:
        return wire.error, "invariant"
    # an unchecked invariant (`not_checked`) has no body to hold the sent one to
    if wire.sha256 and result.first_body is not None and hashlib.sha256(
            result.first_body).hexdigest() != wire.sha256:
        return ("InvariantError: the first request sent differs from the one checked before the "
                "block (the invariant was checked on another body)"), "invariant"
    if wire.after is not None:
        if result.first_body is None:
            return ("InvariantError: no first request was sent, so the in-context compaction's "
                    "invariant could not be checked on it"), "invariant"
        if failed := wire.after(result.first_body):
            return failed, "invariant"
    not_applied = getattr(policy, "not_applied", None)
    reason = not_applied() if callable(not_applied) else None
    if reason:
        return f"PolicyError: {reason}", "policy"
    if protocol == "strict" and result.format_errors:
        return (f"ProtocolError: {result.format_errors} protocol error(s) after the fork (strict "
                f"protocol), first: {result.first_format_error}"), "run"
    if result.terminal_status not in TERMINAL:
        return f"non-terminal status {result.terminal_status}", "run"
    return None, None


def wrong_model(requests: Sequence[RequestRecord], served: tuple[str, ...]) -> str | None:
    """The one-line error where a response names a model the run's server does not serve (a
    hosted name now answered by another model, or BASE_URL at the wrong server); else None."""
    found = next((r.served_model for r in requests
                  if served and r.served_model and r.served_model not in served), None)
    if found is None:
        return None
    return (f"WrongModelError: a response names the model '{found}', but this run's server "
            f"serves {', '.join(repr(s) for s in served)}: another model answered; point "
            "BASE_URL at the intended server, or fix the profile's served names")


def arm_record(arm: Arm, result: Result, *, policy: HistoryPolicy, wire: WireCheck,
               settings: BlockSettings, regime: str, block: int, attempt: str, seed: int,
               salt: str | None, origin: float) -> ArmRecord:
    """One attempt's record: the protocol check and everything the analysis needs."""
    error, phase = protocol_error(arm, result, wire, policy, settings.protocol,
                                  settings.served_names)
    first = result.requests[0] if result.requests else None
    compactions = list(getattr(policy, "results", []))
    requests = [c for c in compactions if c.drafts]
    own = getattr(policy, "rewrite_record", None)  # a policy that records its own requests
    rewrite = own() if callable(own) else {
        "rewrite_requests": sum(c.drafts for c in requests) if compactions else 0,
        "rewrite_cache_hits": sum(c.cache_hit for c in compactions),
        "rewrite_prompt_tokens": _sum([c.prompt_tokens for c in requests]),
        "rewrite_completion_tokens": _sum([c.completion_tokens for c in requests]),
        "rewrite_failed_blocks": sum(c.outcome == "failed" for c in compactions)}
    return ArmRecord(
        regime=regime, block=block, arm=arm.name, attempt=attempt,
        status="failed" if error else "complete", postfork_s=result.postfork_s, error=error,
        rewrite_s=result.rewrite_s, turns=result.turns, terminal_status=result.terminal_status,
        reasoning_tokens=result.reasoning_tokens,
        completion_tokens=_sum([r.completion_tokens for r in result.requests]),
        history_tokens=first.prompt_tokens if first else None,
        validation=result.validation.passed if result.validation else None,
        validation_tail=result.validation.output[-1000:] if result.validation else None,
        protocol_ok=error is None, started_s=result.started_s - origin,
        ended_s=result.ended_s - origin, seed=seed, cache_mode=settings.config.cache,
        cache_salt=salt, fork_prompt_tokens=first.prompt_tokens if first else None,
        fork_cached_tokens=first.cached_tokens if first else None,
        fork_cache_state=cache_state(first.prompt_tokens if first else None,
                                     first.cached_tokens if first else None,
                                     settings.block_size),
        first_request_s=first.sent_s - origin if first else None, setup_s=result.setup_s,
        helper_wait_s=result.helper_wait_s or None,
        error_phase=phase, protocol=settings.protocol, format_errors=result.format_errors,
        reasoning_source=result.reasoning_source,
        **rewrite, invariant=dict(wire.report), **dict(arm.fork_rewrite),
        **_source_fields(settings.source.name, arm, result))


def _source_fields(source: str, arm: Arm, result: Result) -> dict[str, Any]:
    """The attempt's source (its SOURCE= name), and what a replayed one adds: what its
    continuation carries and how many forced outputs came back at their recorded length."""
    if not isinstance(result, ReplayResult) or arm.replay is None:
        return {"source": source}
    plan = arm.replay[result.source]
    return {"source": source, "record": result.source, "continuation": plan.continuation,
            "forced_requests": len(result.requests), "forced_exact": result.forced_exact,
            "recorded_completion_tokens": plan.recorded_completion_tokens,
            "recorded_postfork_s": plan.recorded_wall_s, "tool_wait_s": result.tool_wait_s}


def failed_record(arm: Arm, *, regime: str, block: int, attempt: str, seed: int,
                  error: str, phase: str, settings: BlockSettings) -> ArmRecord:
    """The record of an attempt that broke outside the continuation's own boundary."""
    return ArmRecord(regime=regime, block=block, arm=arm.name, attempt=attempt, status="failed",
                     postfork_s=0.0, error=error, error_phase=phase, seed=seed,
                     cache_mode=settings.config.cache, protocol=settings.protocol,
                     protocol_ok=False, **dict(arm.fork_rewrite))


class _Release:
    """Arms wait here after setup; the block releases them together, in the recorded order."""

    def __init__(self, names: list[str]) -> None:
        self.ready = {n: threading.Event() for n in names}
        self.go = {n: threading.Event() for n in names}

    def gate(self, name: str) -> Callable[[], None]:
        def wait() -> None:
            self.ready[name].set()
            self.go[name].wait()
        return wait

    def release(self, order: list[str], clock: Clock) -> float:
        for name in order:
            self.ready[name].wait(SETUP_TIMEOUT_S)
        released = clock()
        for name in order:
            self.go[name].set()
        return released


def arm_session(regime: str, block: int, arm: str, attempt: str) -> str:
    """The session id of one arm's continuation in one block (one agent): every request of it
    carries this X-Session-Id, so a session-affine router keeps the agent on one replica."""
    return f"{regime}-b{block}-{arm}-{attempt}"


def run_block(arms: list[Arm], *, settings: BlockSettings, regime: str, block: int,
              rng: np.random.Generator, writer: RunWriter, attempt: str = "original",
              block_pass: int = 1, clock: Clock = monotonic,
              reference: Arm | None = None) -> BlockOutcome:
    """Run the arms side by side; return (and append) one record per arm (module docstring).
    `reference`: clean's arm, where `arms` lacks it, to check the invariant against."""
    config = settings.config
    order = [arms[i] for i in rng.permutation(len(arms))]
    clean = next((a for a in arms if a.name == REFERENCE), reference)
    started = clock()
    release = _Release([a.name for a in order])
    records: dict[str, ArmRecord] = {}

    def attempt_config(arm: Arm, seed: int) -> tuple[ChatModelConfig, str | None]:
        # isolated: unique to this run (its clock origin), block pass, arm and attempt, so a
        # block run again after a crash, or a rerun under the same RUN_ID, starts cold too
        salt = cache_salt(config, settings.run_salt or settings.run_id, block, block_pass,
                          arm.name, attempt)
        extra = {**settings.model.extra_body, **dialect.cache_salt(salt)}
        return settings.model.model_copy(update={"seed": seed, "extra_body": extra}), salt

    source = settings.source
    record_name = settings.record_for(block) if any(a.replay for a in arms) else None

    def one(arm: Arm) -> None:
        seed = arm_seed(config, config.position(block), arm.name, attempt)
        context = AttemptContext(regime=regime, block=block, attempt=attempt, seed=seed,
                                 ledger=settings.ledger, origin_s=writer.origin,
                                 on_record=lambda r: writer.request(
                                     r, regime=regime, block=block,
                                     source=f"{arm.name}/compressor", attempt=attempt),
                                 record=record_name)
        gate = release.gate(arm.name)
        try:
            arm_config, salt = attempt_config(arm, seed)
            clean_config = None if clean is None else attempt_config(
                clean, arm_seed(config, config.position(block), clean.name, attempt))[0]

            def record_request(record: RequestRecord, _: PreparedRequest) -> None:
                writer.request(record, regime=regime, block=block, source=arm.name,
                               attempt=attempt, **({"block_pass": block_pass}
                                                   if block_pass > 1 else {}))

            run = Attempt(arm=arm, config=arm_config, context=context,
                          session_id=arm_session(regime, block, arm.name, attempt),
                          on_request=record_request, gate=gate, clock=clock)
            wire = not_checked() if clean is None or clean_config is None else (
                source.check(run, clean, clean_config))
            policy = arm.new_policy(context)
            result = source.run(run, policy)
            record = arm_record(arm, result, policy=policy, wire=wire, settings=settings,
                                regime=regime, block=block, attempt=attempt, seed=seed,
                                salt=salt, origin=writer.origin)
            record = dataclasses.replace(record, block_pass=block_pass if block_pass > 1 else None)
        except Exception as exc:  # the per-arm boundary: whatever broke, the arm gets a record
            gate_event = release.ready[arm.name]
            if not gate_event.is_set():
                gate_event.set()
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
            record = failed_record(arm, regime=regime, block=block, attempt=attempt, seed=seed,
                                   error=f"InternalError: {type(exc).__name__}: {exc}{where}",
                                   phase="setup", settings=settings)
            record = dataclasses.replace(
                record, block_pass=block_pass if block_pass > 1 else None,
                source=source.name, record=record_name)
        writer.arm(record)
        records[arm.name] = record

    threads = [threading.Thread(target=one, args=(arm,), name=f"arm-{arm.name}", daemon=True)
               for arm in order]
    if config.side_by_side is False:  # one after another, in the recorded order
        released = None
        for arm, thread in zip(order, threads, strict=True):
            thread.start()
            at = release.release([arm.name], clock)
            released = released if released is not None else at
            thread.join()
    else:
        for thread in threads:
            thread.start()
        released = release.release([a.name for a in order], clock)
        for thread in threads:
            thread.join()
    return BlockOutcome(records=[records[a.name] for a in order if a.name in records],
                        order=tuple(a.name for a in order),
                        # the sampling seed the block's arms used (clean's: common to every arm
                        # but the placebo under SEEDS=common; each arm's own is in its record)
                        seed=arm_seed(config, config.position(block), REFERENCE, attempt),
                        started_s=started,
                        released_s=released, ended_s=clock(), block_pass=block_pass,
                        record=record_name)
