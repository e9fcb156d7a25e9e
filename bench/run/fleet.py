"""One cell of the load-response sweep: a closed-loop fleet of N agents of one arm.

Each agent runs one continuation after another through the block machinery
(`bench.run.block.run_block` with the one arm), each continuation with its own block number and
so its own sampling seed; which of them are measured is the `Fleet`'s rule (bench/run/sweep.py
states it: warm-up, measured share, drain).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.block import BlockSettings, run_block
from compaction_bench.bench.run.config import SWEEP, SweepSettings, continuation_block
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord, BlockRecord
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.transport.client import RequestRecord

PHASES = ("warmup", "measured", "drain")


class _ContinuationWriter(RunWriter):
    """The run's writer as one continuation of a cell sees it: its arm record gets the sweep
    fields, its requests (and its compressor's) the same as labels. It opens no files of its
    own and closes none: everything goes through the run's writer, so a stopping run's cancel
    and a full disk's failure act on the continuation too."""

    def __init__(self, shared: RunWriter, fields: dict[str, Any]) -> None:
        # deliberately not RunWriter.__init__: that would open the run's files a second time
        self.run_dir = shared.run_dir
        self.origin = shared.origin
        self.shared = shared
        self.fields = fields

    def request(self, record: RequestRecord, **identity: Any) -> None:
        self.shared.request(record, **identity, **self.fields)

    def arm(self, record: Any) -> bool:
        return self.shared.arm(dataclasses.replace(record, **self.fields))

    def block(self, record: Any) -> bool:
        return self.shared.block(record)

    def cancel(self) -> None:
        self.shared.cancel()

    def sync(self) -> None:
        self.shared.sync()

    def close(self) -> None:  # the run closes the shared files
        pass


@dataclass
class Fleet:
    """Which phase each agent's next continuation has (module docstring, steps 1-3)."""

    agents: int
    quota: int
    warmup: int
    level_s: float
    started_s: float
    clock: Clock
    begun: list[int] = field(default_factory=list)
    measured: list[int] = field(default_factory=list)
    measuring: list[bool] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.begun = [0] * self.agents
        self.measured = [0] * self.agents
        self.measuring = [True] * self.agents

    def next_phase(self, agent: int) -> str | None:
        """The phase of `agent`'s next continuation, or None when it should stop. Called when
        the agent has nothing in flight."""
        with self.lock:
            self.begun[agent] += 1
            if self.begun[agent] <= self.warmup:
                return "warmup"
            if self.measured[agent] < self.quota or (
                    self.clock() - self.started_s < self.level_s):
                self.measured[agent] += 1
                return "measured"
            self.measuring[agent] = False
            if any(self.measuring):
                return "drain"
            return None


@dataclass(frozen=True)
class CellOutcome:
    """One finished (arm, level) cell: its records and the `sweep.jsonl` line."""

    records: list[ArmRecord]
    line: dict[str, Any]


def run_cell(arm: Arm, level: int, *, settings: BlockSettings, sweep: SweepSettings,
             writer: RunWriter, cell_pass: int = 1,
             stopped: Callable[[], bool] = lambda: False,
             clock: Clock = monotonic, reference: Arm | None = None) -> CellOutcome:
    """Run one cell: `level` agents of `arm` in a closed loop (module docstring); each
    continuation's invariant is checked against `reference` (clean's arm; None: recorded as
    not checked). When `stopped()` turns true no agent starts another continuation; the cell
    is `interrupted`."""
    started = clock()
    fleet = Fleet(agents=level, quota=max(1, math.ceil(sweep.continuations / level)),
                   warmup=sweep.warmup, level_s=sweep.level_s, started_s=started, clock=clock)
    records: list[ArmRecord] = []
    lock = threading.Lock()
    seed = settings.config.seed

    def agent(i: int) -> None:
        index = 0
        while not stopped():
            phase = fleet.next_phase(i)
            if phase is None:
                return
            block = continuation_block(level, i, index)
            view = _ContinuationWriter(writer, {"level": level, "sweep_agent": i,
                                                "sweep_index": index, "sweep_phase": phase})
            outcome = run_block([arm], settings=settings, regime=SWEEP, block=block,
                                rng=np.random.default_rng([seed, block]), writer=view,
                                block_pass=cell_pass, clock=clock, reference=reference)
            origin = writer.origin
            writer.block(BlockRecord(
                regime=SWEEP, block=block, order=outcome.order,
                started_s=outcome.started_s - origin, ended_s=outcome.ended_s - origin,
                seed=outcome.seed, released_s=None if outcome.released_s is None
                else outcome.released_s - origin,
                load={"level": level, "arm": arm.name, "sweep_agent": i, "sweep_index": index,
                      "sweep_phase": phase}, block_pass=cell_pass if cell_pass > 1 else None))
            with lock:
                records.extend(dataclasses.replace(r, level=level, sweep_agent=i,
                                                   sweep_index=index, sweep_phase=phase)
                               for r in outcome.records)
            index += 1

    threads = [threading.Thread(target=agent, args=(i,), name=f"sweep-{arm.name}-{level}-{i}",
                                daemon=True) for i in range(level)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():  # short joins: Ctrl-C reaches the main thread
            thread.join(0.5)
    ended = clock()
    counts = {p: sum(r.sweep_phase == p for r in records) for p in PHASES}
    measured = [r for r in records if r.sweep_phase == "measured"]
    origin = writer.origin
    line = {"arm": arm.name, "level": level, "agents": level, "cell_pass": cell_pass,
            "status": "interrupted" if stopped() else "done",
            "started_s": started - origin, "ended_s": ended - origin,
            "quota_per_agent": fleet.quota, "warmup_per_agent": sweep.warmup,
            "level_s": sweep.level_s, "continuations": counts,
            "measured_failed": sum(not r.complete for r in measured),
            "measured_window_s": [min((r.started_s for r in measured
                                       if r.started_s is not None), default=None),
                                  max((r.ended_s for r in measured
                                       if r.ended_s is not None), default=None)]}
    return CellOutcome(records=records, line=line)
