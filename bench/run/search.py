"""`make bench REGIME=search SLO=p90:2x`: capacity in one run, where a sweep measures every level.

Per arm, the largest closed-loop fleet whose SLO quantile holds: levels 1, 2, 4, ... probed up to
`search.max_level` while they hold, bisected between the last that held and the first that
failed, the boundary confirmed by running its two levels again with
`search.confirm_continuations` measured continuations (bench/run/boundary.py: the decisions,
the quantile and its interval, the answer). Each cell is a sweep cell (bench/run/fleet.py
`run_cell`: warm-up, measured share, drain, the sweep's seeds and records), so `make plan` reads
a search run as a sweep of the levels it tried; a confirmation is its cell's next pass, the one
the plan reads.

The SLO bounds an agent's wall time (postfork plus inline rewriting, as the plan's default); a
relative SLO (`p90:2x`) is a factor of clean's quantile at N = 1, recomputed from clean's latest
pass there, so every decision is retaken from the latest passes after each round. The arms
search side by side in rounds: each round runs every unfinished arm's next cell, in a seeded
random order, so slow drift of the machine does not line up with one arm.

Records: the sweep's (arm and request records, `sweep.jsonl` with `search_step` on each cell's
line) and `search.jsonl`: one `decision` line per cell run (level, pass, n, failures, quantile
and interval, limit, held or failed and why) and one `result` line per arm at the end (agents,
or `unbounded_up_to`, and the interval). `RESUME=<run-id>` replays the decisions from the cells
on record, running only those missing; a cell a crash cut short runs again as its next pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compaction_bench.bench.run.arm import Arm
from compaction_bench.bench.run.boundary import (
    Capacity,
    Measure,
    Step,
    Verdict,
    capacity,
    measure,
    next_step,
    verdict,
)
from compaction_bench.bench.run.config import REFERENCE, SWEEP, BenchConfig
from compaction_bench.bench.run.fleet import run_cell
from compaction_bench.bench.run.hostwatch import HostSampler
from compaction_bench.bench.run.session import Session
from compaction_bench.bench.run.source import SourceKind
from compaction_bench.bench.run.sweep import (
    SWEEP_FILE,
    fleet_watch,
    server_cache_config,
    sweep_config,
    with_host,
)
from compaction_bench.bench.run.writer import RunWriter
from compaction_bench.bench.runfolder import ArmRecord, read_run
from compaction_bench.common.files import JsonlWriter, read_jsonl
from compaction_bench.common.slo import Slo, parse_slo
from compaction_bench.serve.endpoints import is_healthy
from compaction_bench.serve.profile import Profile

SEARCH_FILE = "search.jsonl"
ROUNDS = 1_000  # a guard only: the search ends after at most 2 x max_level cells per arm


def wall_s(record: ArmRecord) -> float:
    """The time the SLO bounds: postfork plus the rewriting the agent waited through inline."""
    return record.postfork_s + (record.rewrite_s or 0.0)


def level_measure(records: list[ArmRecord], q: float, confidence: float) -> Measure:
    measured = [r for r in records if r.sweep_phase == "measured"]
    return measure([wall_s(r) for r in measured if r.complete],
                   sum(not r.complete for r in measured), q, confidence)


@dataclass
class ArmSearch:
    """One arm's tested levels: the latest pass's measure of each, the confirmed ones."""

    arm: str
    measures: dict[int, Measure] = field(default_factory=dict)
    confirmed: set[int] = field(default_factory=set)

    def verdicts(self, limit_s: float, label: str) -> dict[int, Verdict]:
        return {n: verdict(m, limit_s, label) for n, m in self.measures.items()}

    def step(self, limit_s: float, label: str, max_level: int) -> Step:
        held = {n: v.held for n, v in self.verdicts(limit_s, label).items()}
        return next_step(held, self.confirmed, max_level)

    def answer(self, limit_s: float, label: str, max_level: int) -> Capacity:
        """The arm's capacity from its tested levels' latest passes (`make plan` of the same
        cells names the same largest level within the SLO, plan/capacity.py `within_slo`)."""
        return capacity(self.verdicts(limit_s, label), max_level)


def limit_s(slo: Slo, reference: ArmSearch) -> float | None:
    """The SLO in seconds; for a relative one, None until clean has run alone."""
    if not slo.relative:
        return slo.value
    alone = reference.measures.get(1)
    return None if alone is None else slo.value * alone.point_s


@dataclass
class OnRecord:
    """What a resumed search finds: finished cells by (arm, level, confirmation), every cell's
    records by (arm, level, pass), the highest pass of each (arm, level), decisions written."""

    lines: dict[tuple[str, int, bool], dict[str, Any]] = field(default_factory=dict)
    records: dict[tuple[str, int, int], list[ArmRecord]] = field(default_factory=dict)
    passes: dict[tuple[str, int], int] = field(default_factory=dict)
    decided: set[tuple[str, int, int]] = field(default_factory=set)

    @classmethod
    def read(cls, run_dir: Path) -> OnRecord:
        found = cls()
        if (run_dir / SWEEP_FILE).is_file():
            for obj in read_jsonl(run_dir / SWEEP_FILE).objects:
                if obj.get("status") == "done" and obj.get("search_step"):
                    found.lines[(str(obj["arm"]), int(obj["level"]),
                                 obj["search_step"] == "confirm")] = obj
        if (run_dir / "arms.jsonl").is_file():
            for r in read_run(run_dir).arms:
                if r.regime == SWEEP and r.level is not None:
                    key = (r.arm, r.level, r.block_pass or 1)
                    found.records.setdefault(key, []).append(r)
                    was = found.passes.get((r.arm, r.level), 0)
                    found.passes[(r.arm, r.level)] = max(was, r.block_pass or 1)
        if (run_dir / SEARCH_FILE).is_file():
            for obj in read_jsonl(run_dir / SEARCH_FILE).objects:
                if obj.get("kind") == "decision":
                    found.decided.add((str(obj["arm"]), int(obj["level"]),
                                       int(obj["cell_pass"])))
        return found


class Search:
    """The kind of run that searches each arm's capacity (module docstring); it stops as a
    sweep does: the cut cell without its `sweep.jsonl` line, run again by `RESUME`."""

    name = "search"

    def __init__(self) -> None:
        self.max_level = 0
        self.found = OnRecord()
        self.host: HostSampler | None = None  # the run's host sampler, while the cells run

    def adjust(self, config: BenchConfig, profile: Profile, source: SourceKind) -> BenchConfig:
        self.max_level = config.search.max_for(profile.engine_args.max_num_seqs)
        return sweep_config(config, profile.engine, source)

    def prints(self, config: BenchConfig, profile: Profile) -> dict[str, Any]:
        return {"sweep": config.sweep.model_dump(mode="json"), "slo": config.slo,
                "search": {**config.search.model_dump(mode="json"),
                           "max_level": self.max_level}}

    def prepare(self, session: Session) -> dict[str, Any]:
        config = session.config
        self.found = OnRecord.read(session.run_dir)
        return {"users": 0, "blocks": 0,
                "sweep": {"levels": [], "arms": list(config.arms),
                          "step_limit": config.step_limit,
                          "settings": config.sweep.model_dump(mode="json"),
                          "server_cache_config": server_cache_config(session.url)},
                "search": {"slo": config.slo, "max_level": self.max_level,
                           "settings": config.search.model_dump(mode="json")}}

    def run(self, session: Session) -> tuple[list[ArmRecord], str | None]:
        config, stop = session.config, session.stop
        session.say(f"[search] run {session.run_id}: SLO {parse_slo(config.slo).label}, arms "
                    f"{', '.join(config.arms)}, levels up to {self.max_level}, "
                    f"{len(self.found.lines)} cells already done -> {session.run_dir}")
        writer = session.writer()
        cells_out = JsonlWriter(session.run_dir / SWEEP_FILE)
        decisions = JsonlWriter(session.run_dir / SEARCH_FILE)
        records: list[ArmRecord] = []
        aborted = None
        try:
            with fleet_watch(session, stop) as host:
                self.host = host
                records, aborted = self._search(session, writer, cells_out, decisions)
        except KeyboardInterrupt as exc:
            stop.interrupted(exc)
        finally:
            decisions.close()
            cells_out.close()
            writer.close()
        if aborted is None and not stop.stopped:
            session.say(f"[search] done: make plan RUN={session.run_id} SLO={config.slo}")
        return records, aborted

    def _search(self, session: Session, writer: RunWriter, cells_out: JsonlWriter,
                decisions: JsonlWriter) -> tuple[list[ArmRecord], str | None]:
        """Rounds of cells until every arm's search is done: (records, why it ended early)."""
        config = session.config
        slo = parse_slo(config.slo)
        label = f"p{100 * slo.quantile:g}"
        arms = {a.name: a for a in session.arms}
        states = {name: ArmSearch(name) for name in config.arms}
        records: list[ArmRecord] = []
        for round_ in range(ROUNDS):
            limit = limit_s(slo, states[REFERENCE])
            if limit is not None and math.isinf(limit):
                return records, (f"clean's {label} at N=1 is past any limit (its continuations "
                                 f"failed), so SLO={config.slo} has no seconds; give the SLO "
                                 "in seconds (SLO=p90:120s) or fix the failures")
            steps = {name: (Step("probe", 1) if limit is None else
                            s.step(limit, label, self.max_level)) for name, s in states.items()}
            todo = [name for name in config.arms if steps[name].kind != "done"]
            if not todo:
                break
            rng = np.random.default_rng([config.seed, round_])
            ran: list[tuple[str, Step, int]] = []
            for name in [todo[i] for i in rng.permutation(len(todo))]:
                step = steps[name]
                got, cell_pass, cut = self._cell(session, arms[name], step, writer, cells_out,
                                                 reference=arms.get(REFERENCE))
                records += got
                if cut is not None or session.stop.stopped:
                    return records, cut
                states[name].measures[step.level] = level_measure(
                    self.found.records.get((name, step.level, cell_pass), []), slo.quantile,
                    config.search.confidence)
                if step.kind == "confirm":
                    states[name].confirmed.add(step.level)
                ran.append((name, step, cell_pass))
            limit = limit_s(slo, states[REFERENCE])  # clean's N=1 has run by now
            assert limit is not None
            for name, step, cell_pass in ran:
                self._decision(session, decisions, states[name], step, cell_pass, limit, label)
        limit = limit_s(slo, states[REFERENCE])
        assert limit is not None
        for name, state in states.items():
            verdicts = state.verdicts(limit, label)
            answer = state.answer(limit, label, self.max_level)
            decisions.write({"kind": "result", "arm": name, "slo": config.slo,
                             "limit_s": limit, **answer.to_json(),
                             "held": {str(n): v.held for n, v in sorted(verdicts.items())},
                             "confirmed": sorted(state.confirmed)})
            session.say(f"[search] {name}: {answer.text} meet {slo.label}"
                        + (f" = {limit:.3g} s" if slo.relative else ""))
        return records, None

    def _cell(self, session: Session, arm: Arm, step: Step, writer: RunWriter,
              cells_out: JsonlWriter, *, reference: Arm | None
              ) -> tuple[list[ArmRecord], int, str | None]:
        """The step's cell, from the record or run now: (new records, its pass, why the search
        stops here or None). `reference`: clean's arm, the invariant's reference for every
        arm's cell (an arm checked against itself would pass by construction)."""
        confirm = step.kind == "confirm"
        line = self.found.lines.get((arm.name, step.level, confirm))
        if line is not None:
            return [], int(line.get("cell_pass") or 1), None
        config = session.config
        cell_pass = self.found.passes.get((arm.name, step.level), 0) + 1
        sweep = config.sweep
        if confirm:
            sweep = sweep.model_copy(update={
                "min_continuations": config.search.confirm_continuations})
        assert session.settings is not None
        outcome = run_cell(arm, step.level, settings=session.settings, sweep=sweep,
                           writer=writer, cell_pass=cell_pass,
                           stopped=lambda: session.stop.stopped, reference=reference)
        self.found.passes[(arm.name, step.level)] = cell_pass
        if session.stop.stopped:  # the cut cell gets no line: RESUME runs it again
            return outcome.records, cell_pass, None
        writer.sync()
        with_host(outcome.line, self.host, session.run_dir)
        cells_out.write({**outcome.line, "search_step": step.kind})
        self.found.lines[(arm.name, step.level, confirm)] = outcome.line
        self.found.records[(arm.name, step.level, cell_pass)] = outcome.records
        if not is_healthy(session.url):
            return outcome.records, cell_pass, (
                f"the server at {session.url} stopped answering during {arm.name} "
                f"N={step.level}; {session.hint} after restarting it")
        return outcome.records, cell_pass, None

    def _decision(self, session: Session, decisions: JsonlWriter, state: ArmSearch, step: Step,
                  cell_pass: int, limit: float, label: str) -> None:
        m = state.measures[step.level]
        v = verdict(m, limit, label)
        session.say(f"[search] {state.arm} N={step.level} ({step.kind}, pass {cell_pass}, "
                    f"n={m.n_all}): {'held' if v.held else 'failed'}: {v.why}")
        if (state.arm, step.level, cell_pass) in self.found.decided:
            return  # a resumed run: this decision is on record already
        self.found.decided.add((state.arm, step.level, cell_pass))
        decisions.write({
            "kind": "decision", "arm": state.arm, "level": step.level, "step": step.kind,
            "cell_pass": cell_pass, "n": m.n, "failed": m.failed, "quantile": label,
            "quantile_s": _finite(m.point_s), "interval_s": [_finite(m.low_s),
                                                             _finite(m.high_s)],
            "interval": f"order statistics, {session.config.search.confidence:.0%}",
            "limit_s": limit, "held": v.held, "clear": v.clear, "why": v.why})


def _finite(value: float) -> float | None:
    """JSON has no infinity: None stands for an unbounded end (or a quantile past any limit)."""
    return None if math.isinf(value) else value
