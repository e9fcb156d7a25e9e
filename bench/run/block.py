"""One block: every arm of one task continued side by side, one experimental client per arm,
in a seeded random start order. Each arm's outcome becomes one `ArmRecord`; a failing arm keeps
its record and its duration."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.analysis.runfolder import ArmRecord, BlockRecord
from bench.run.arm import Arm
from bench.run.writer import RunWriter
from common.timing import Clock, monotonic
from histories.agent.chat import ChatModelConfig
from histories.agent.continuation import ContinuationResult, continue_history
from histories.tasks.task import Task

# mini-swe-agent's terminal statuses: reaching one of them (without a transport error) is
# protocol completion; "TransportError" is ours, for a request that failed.
TERMINAL = frozenset({"Submitted", "LimitsExceeded", "RepeatedFormatError", "TimeExceeded"})


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def arm_record(arm: Arm, result: ContinuationResult, *, regime: str, block: int,
               attempt: str, origin: float) -> ArmRecord:
    """Protocol check: a terminal status, no transport error, the invariant held."""
    error = result.error or arm.invariant_error
    ok = error is None and result.terminal_status in TERMINAL
    return ArmRecord(
        regime=regime, block=block, arm=arm.name, attempt=attempt,
        status="complete" if ok else "failed", postfork_s=result.postfork_s,
        error=error if error or ok else f"non-terminal status {result.terminal_status}",
        rewrite_s=result.rewrite_s, turns=result.turns,
        terminal_status=result.terminal_status,
        reasoning_tokens=_sum([r.reasoning_tokens for r in result.requests]),
        completion_tokens=_sum([r.completion_tokens for r in result.requests]),
        history_tokens=result.requests[0].prompt_tokens if result.requests else None,
        validation=result.validation.passed if result.validation else None,
        protocol_ok=ok, started_s=result.started_s - origin, ended_s=result.ended_s - origin)


def run_block(arms: list[Arm], *, task: Task, config: ChatModelConfig, regime: str,
              block: int, rng: np.random.Generator, writer: RunWriter, attempt: str = "original",
              step_limit: int | None = None, cache_salt: str | None = None,
              clock: Clock = monotonic) -> list[ArmRecord]:
    """Run the arms side by side; return (and append) one record per arm."""
    order = [arms[i] for i in rng.permutation(len(arms))]
    started = clock()

    def one(arm: Arm) -> ArmRecord:
        arm_config = config
        if cache_salt:
            salt = {"cache_salt": f"{cache_salt}-{block}-{arm.name}"}
            arm_config = config.model_copy(update={"extra_body": {**config.extra_body, **salt}})
        result = continue_history(
            arm.history, task, arm_config, step_limit=step_limit, clock=clock,
            policy=arm.new_policy(),
            on_request=lambda r, _: writer.request(r, regime=regime, block=block,
                                                   source=arm.name, attempt=attempt))
        record = arm_record(arm, result, regime=regime, block=block, attempt=attempt,
                            origin=writer.origin)
        writer.arm(record)
        return record

    with ThreadPoolExecutor(max_workers=len(order), thread_name_prefix="arm") as pool:
        futures = [pool.submit(one, arm) for arm in order]  # submitted in the random order
        records = [f.result() for f in futures]
    if attempt == "original":
        writer.block(BlockRecord(regime=regime, block=block,
                                 order=tuple(a.name for a in order),
                                 started_s=started - writer.origin,
                                 ended_s=clock() - writer.origin))
    return records
