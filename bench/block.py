"""One block: every arm of one task continued side by side, one experimental client per arm,
in a seeded random start order. Each arm's outcome becomes one `ArmRecord`; a failing arm keeps
its record and its duration."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.records import ArmRecord, BlockRecord, RequestRecord
from histories.chat import ChatModelConfig
from histories.chat import RequestRecord as ClientRecord
from histories.continuation import ContinuationResult, continue_history
from histories.format import History
from histories.policy import HistoryPolicy
from histories.tasks import Task
from histories.timing import Clock, monotonic
from loadgen.records import JsonlWriter

# mini-swe-agent's terminal statuses: reaching one of them (without a transport error) is
# protocol completion; "TransportError" is ours, for a request that failed.
TERMINAL = frozenset({"Submitted", "LimitsExceeded", "RepeatedFormatError", "TimeExceeded"})


@dataclass(frozen=True)
class ArmPlan:
    """What an arm continues from and how it treats its history on the way."""

    arm: str
    history: History
    new_policy: Callable[[], HistoryPolicy]  # a fresh policy (and its state) per continuation
    invariant_error: str | None = None  # the reasoning-only invariant, checked before the run


class RunWriter:
    """Appends records to a run folder as they happen, on the run's clock (seconds from its
    start). Safe across threads (the arms) and processes: locust appends background requests to
    the same `requests.jsonl`, so every line goes out in one O_APPEND write (`JsonlWriter`)."""

    FILES = ("requests.jsonl", "arms.jsonl", "blocks.jsonl")

    def __init__(self, run_dir: Path, origin: float) -> None:
        self.run_dir = run_dir
        self.origin = origin
        self._writers = {name: JsonlWriter(run_dir / name) for name in self.FILES}

    def _append(self, name: str, record: ArmRecord | BlockRecord | RequestRecord) -> None:
        self._writers[name].write(asdict(record))

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()

    def request(self, record: ClientRecord, *, regime: str, block: int, source: str) -> None:
        o = self.origin
        self._append("requests.jsonl", RequestRecord(
            regime=regime, source=source, request_id=record.request_id, sent_s=record.sent_s - o,
            status=record.status, block=block, intended_send_s=record.sent_s - o,
            first_token_s=None if record.first_token_s is None else record.first_token_s - o,
            end_s=record.end_s - o, chunk_times_s=tuple(t - o for t in record.chunk_times_s),
            prompt_tokens=record.prompt_tokens, cached_tokens=record.cached_tokens,
            completion_tokens=record.completion_tokens,
            reasoning_tokens=record.reasoning_tokens, error=record.error))

    def arm(self, record: ArmRecord) -> None:
        self._append("arms.jsonl", record)

    def block(self, record: BlockRecord) -> None:
        self._append("blocks.jsonl", record)


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def arm_record(plan: ArmPlan, result: ContinuationResult, *, regime: str, block: int,
               attempt: str, origin: float) -> ArmRecord:
    """Protocol check: a terminal status, no transport error, the invariant held."""
    error = result.error or plan.invariant_error
    ok = error is None and result.terminal_status in TERMINAL
    return ArmRecord(
        regime=regime, block=block, arm=plan.arm, attempt=attempt,
        status="complete" if ok else "failed", postfork_s=result.postfork_s,
        error=error if error or ok else f"non-terminal status {result.terminal_status}",
        rewrite_s=result.rewrite_s, turns=result.turns,
        terminal_status=result.terminal_status,
        reasoning_tokens=_sum([r.reasoning_tokens for r in result.requests]),
        completion_tokens=_sum([r.completion_tokens for r in result.requests]),
        history_tokens=result.requests[0].prompt_tokens if result.requests else None,
        validation=result.validation.passed if result.validation else None,
        protocol_ok=ok, started_s=result.started_s - origin, ended_s=result.ended_s - origin)


def run_block(plans: list[ArmPlan], *, task: Task, config: ChatModelConfig, regime: str,
              block: int, rng: np.random.Generator, writer: RunWriter, attempt: str = "original",
              step_limit: int | None = None, cache_salt: str | None = None,
              clock: Clock = monotonic) -> list[ArmRecord]:
    """Run the arms side by side; return (and append) one record per arm."""
    order = [plans[i] for i in rng.permutation(len(plans))]
    started = clock()

    def one(plan: ArmPlan) -> ArmRecord:
        arm_config = config
        if cache_salt:
            salt = {"cache_salt": f"{cache_salt}-{block}-{plan.arm}"}
            arm_config = config.model_copy(update={"extra_body": {**config.extra_body, **salt}})
        result = continue_history(
            plan.history, task, arm_config, step_limit=step_limit, clock=clock,
            policy=plan.new_policy(),
            on_request=lambda r: writer.request(r, regime=regime, block=block, source=plan.arm))
        record = arm_record(plan, result, regime=regime, block=block, attempt=attempt,
                            origin=writer.origin)
        writer.arm(record)
        return record

    with ThreadPoolExecutor(max_workers=len(order), thread_name_prefix="arm") as pool:
        futures = [pool.submit(one, plan) for plan in order]  # submitted in the random order
        records = [f.result() for f in futures]
    if attempt == "original":
        writer.block(BlockRecord(regime=regime, block=block,
                                 order=tuple(p.arm for p in order),
                                 started_s=started - writer.origin,
                                 ended_s=clock() - writer.origin))
    return records
