"""Whether the host was quiet while a block (or a sweep or search cell) ran: a pure function of
the run's `host.jsonl` (bench/run/hostwatch.py) over the span's [start, end] on the run clock.

Each host sample carries cumulative counters: `busy_s`, the CPU seconds the host's CPUs (those
the run may use) spent busy (everything but idle, iowait and steal); `own_s`, the CPU seconds of
the run's own processes (the bench and its descendants, reaped ones included, and the served
model's process tree where it runs on this host); `steal_s`, the time a hypervisor gave the
CPUs to another guest, where the kernel reports it. Between two samples, the foreign CPU is
`busy - own`: what other processes on this host used. A span's figures are the averages, in
cores, over the sample intervals that overlap it (each weighted by its overlap).

Verdicts:
- `contended`: other processes used at least `FOREIGN_CORES_LIMIT` cores on average, or the
  hypervisor stole at least `STEAL_CORES_LIMIT`; the verdict says how many of how many cores.
- `quiet`: both below their limits.
- `unknown`: no host samples around the span (a run folder from before host sampling, a
  host where psutil could not read the counters), fewer than `MIN_HOST_SAMPLES` samples bounding
  it, or intervals covering less than `MIN_COVERAGE` of it. Lack of data is never `quiet`.

The bench calls it at every block's end (the block record's `host`) and every cell's end (the
cell's line in `sweep.jsonl`); analysis recomputes it from `host.jsonl`, so the two agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.runfolder import RunRecords
from compaction_bench.common.files import read_jsonl

# A quarter of one core, on average over the span. An idle machine's own daemons (the logger,
# sshd, the kernel's threads, a shell) stay near 0.02 cores on the 2-core CI machine; a process
# holding a core a quarter of the time takes a quarter of a core from the arms whenever the run
# keeps every core busy, which on the CPU default (the served model decodes on all cores) moves
# an arm's time by about 0.25 / 2 = 12%: the size of the effects the bench measures. A GPU
# host's arms wait on the GPU more than on CPUs, so the same limit is stricter than they need:
# a block contended there is worth a look, not necessarily wrong.
FOREIGN_CORES_LIMIT = 0.25
# Steal is CPU time the hypervisor gave another guest while this one wanted it: the same limit,
# for the same reason (it is time the run's processes could not run).
STEAL_CORES_LIMIT = 0.25
MIN_HOST_SAMPLES = 2  # one interval: the fewest that give a rate
MIN_COVERAGE = 0.5  # the share of the span the sampled intervals must cover
QUIET, CONTENDED, UNKNOWN = "quiet", "contended", "unknown"
HOST_FILE = "host.jsonl"


@dataclass(frozen=True)
class HostPoint:
    """One usable line of host.jsonl (its cumulative counters; see the module docstring)."""

    t_s: float
    busy_s: float
    own_s: float
    n_cpus: int
    steal_s: float | None = None
    first: bool = False  # a sampler's first line: its counters start afresh (a resumed run)


def host_points(lines: Iterable[Mapping[str, Any]]) -> list[HostPoint]:
    """The usable samples of host.jsonl's decoded lines, in time order (the `telemetry: off`
    line and lines with a missing or mistyped counter are skipped)."""
    out = []
    for line in lines:
        t, busy, own, cpus = (line.get(k) for k in ("t_s", "busy_s", "own_s", "n_cpus"))
        if not all(_number(v) for v in (t, busy, own)) or not isinstance(cpus, int) \
                or isinstance(cpus, bool) or cpus <= 0:
            continue
        steal = line.get("steal_s")
        out.append(HostPoint(float(line["t_s"]), float(line["busy_s"]), float(line["own_s"]),
                             cpus, float(steal) if isinstance(steal, int | float)
                             and not isinstance(steal, bool) else None,
                             line.get("first") is True))
    return sorted(out, key=lambda p: p.t_s)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class HostVerdict:
    """The host's state over one span: the verdict, its figures (cores on average) and, for
    `contended` and `unknown`, why in words."""

    verdict: str
    samples: int
    covered_s: float
    n_cpus: int | None = None
    foreign_cores: float | None = None
    own_cores: float | None = None
    steal_cores: float | None = None  # None: the kernel reports no steal
    why: str | None = None

    @property
    def contended(self) -> bool:
        return self.verdict == CONTENDED

    @property
    def quiet(self) -> bool:
        return self.verdict == QUIET

    @property
    def steal_share(self) -> float | None:
        """Steal as a share of the CPUs' time."""
        if self.steal_cores is None or not self.n_cpus:
            return None
        return self.steal_cores / self.n_cpus

    def figure(self) -> str:
        """The foreign CPU in words, with the threshold (and steal where there was any)."""
        if self.foreign_cores is None:
            return self.why or "no host figures"
        text = (f"other processes used {self.foreign_cores:.2g} of {self.n_cpus} cores on "
                f"average (threshold {FOREIGN_CORES_LIMIT:g} cores)")
        share = self.steal_share
        if share is not None and self.steal_cores:
            text += f"; steal {share:.0%} of CPU time ({self.steal_cores:.2g} cores)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steal_share": self.steal_share,
                "figure": None if self.verdict == UNKNOWN else self.figure()}


def host_verdict(points: Sequence[HostPoint], start: float, end: float) -> HostVerdict:
    """The host's verdict over [start, end] on the run clock (module docstring)."""
    span = max(end - start, 1e-9)
    if not points:
        return HostVerdict(UNKNOWN, 0, 0.0, why="no host samples (host.jsonl is missing or "
                           "empty: a run from before host sampling, or psutil could not read "
                           "the host's counters)")
    # no interval across two samplers (a resumed run starts its own counters afresh)
    pairs = [(a, b) for a, b in itertools.pairwise(points)
             if b.t_s > a.t_s and not b.first and min(b.t_s, end) > max(a.t_s, start)]
    bounding = {p.t_s for pair in pairs for p in pair} | {
        p.t_s for p in points if start <= p.t_s <= end}
    covered = sum(min(b.t_s, end) - max(a.t_s, start) for a, b in pairs)
    if not pairs or len(bounding) < MIN_HOST_SAMPLES or covered < MIN_COVERAGE * span:
        return HostVerdict(UNKNOWN, len(bounding), covered, why=(
            f"{len(bounding)} host sample(s) around the span covering {covered:.1f} of "
            f"{end - start:.1f} s (at least {MIN_HOST_SAMPLES} samples covering "
            f"{MIN_COVERAGE:.0%} are needed)"))
    foreign = own = steal = 0.0
    stealing = all(a.steal_s is not None and b.steal_s is not None for a, b in pairs)
    for a, b in pairs:
        weight = (min(b.t_s, end) - max(a.t_s, start)) / (b.t_s - a.t_s)
        busy, mine = b.busy_s - a.busy_s, b.own_s - a.own_s
        foreign += weight * (busy - mine)
        own += weight * mine
        if stealing:
            steal += weight * ((b.steal_s or 0.0) - (a.steal_s or 0.0))
    cpus = max(p.n_cpus for pair in pairs for p in pair)
    # per-interval noise (process times are read a moment apart from the host's) cancels in the
    # sum; only the average is clamped
    foreign_cores = max(0.0, foreign / covered)
    steal_cores = max(0.0, steal / covered) if stealing else None
    hot = foreign_cores >= FOREIGN_CORES_LIMIT or (
        steal_cores is not None and steal_cores >= STEAL_CORES_LIMIT)
    found = HostVerdict(CONTENDED if hot else QUIET, len(bounding), covered, n_cpus=cpus,
                        foreign_cores=foreign_cores, own_cores=max(0.0, own / covered),
                        steal_cores=steal_cores)
    return found


def verdict_of(value: Any) -> str | None:
    """The verdict word of a recorded verdict (a block record's or cell line's `host`)."""
    return value.get("verdict") if isinstance(value, Mapping) else None


def contended_line(verdicts: Sequence[HostVerdict], noun: str = "blocks") -> str | None:
    """'Host: 2 of 6 blocks contended (other processes used up to 1.6 of 2 cores ...)', or
    'Host: 6 of 6 blocks quiet', or None where no span has a verdict."""
    known = [v for v in verdicts if v.verdict != UNKNOWN]
    if not known:
        return None
    hot = [v for v in known if v.contended]
    unknown = len(verdicts) - len(known)
    tail = f"; {unknown} unknown" if unknown else ""
    if not hot:
        return f"Host: {len(known)} of {len(verdicts)} {noun} quiet{tail}."
    worst = max(hot, key=lambda v: v.foreign_cores or 0.0)
    return (f"Host: {len(hot)} of {len(verdicts)} {noun} contended (worst: "
            f"{worst.figure()}){tail}.")


def read_host(run_dir: Path | None) -> list[HostPoint]:
    """The usable samples of a run folder's host.jsonl (none where it has no such file)."""
    if run_dir is None:
        return []
    return host_points(read_jsonl(run_dir / HOST_FILE).objects)


def block_hosts(records: RunRecords) -> dict[tuple[str, int], HostVerdict]:
    """The host verdict of every block with a recorded span, over the time its arms ran (from
    their release; the block's start where unknown), recomputed from host.jsonl."""
    points = read_host(records.path)
    out = {}
    for block in records.blocks:
        if block.started_s is None or block.ended_s is None:
            continue
        start = block.released_s if block.released_s is not None else block.started_s
        out[(block.regime, block.block)] = host_verdict(points, start, block.ended_s)
    return out
