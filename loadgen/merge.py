"""Per-worker background records onto the run's timeline, merged into its requests file.

Each locust worker (on this host or another) writes two files into its folder:

    requests-<worker>.jsonl   raw `RequestRecord`s, appended as requests end, times on the
                              worker's own `time.monotonic()` (never shifted, never rounded)
    worker-<worker>.json      who wrote them (host, pid, locust index), the clock anchor, and,
                              once the worker stopped cleanly, how many records it wrote

Clock anchor: the master sends its setup message at master time `sent`; the worker stamps its
arrival at worker time `w` and answers at once; the answer arrives at master time `back`. The
arrival happened between `sent` and `back`, so worker time `t` is master time
`t - w + (sent + back) / 2`, within +-(back - sent) / 2 (half the round trip: well under a
millisecond on one host or a LAN). The pair is taken once, so clock drift between hosts adds
to it (monotonic clocks are frequency-disciplined by NTP: a few ppm, ~10 ms per hour at worst).
Wall-clock readings of both ends are kept beside it for audit; they are not used (hosts' wall
clocks need not agree). The master's timeline is the bench's (same host, one system-wide
monotonic clock), so records end up counted from the run's start (`origin_s`) like every
other record of `requests.jsonl`.

`merge_workers` checks before it writes anything: every worker stopped cleanly (its count is
known), its file holds exactly that many records, no request id twice (within a worker, across
workers, or merged from this worker before: ids alone repeat when a resumed run starts its load
again), each user's requests numbered without a gap, and each user (agent) on one worker only.
Any failure is one `MergeError` line naming the file.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import JsonlWriter, read_jsonl, write_json_atomic
from compaction_bench.transport.request import RequestRecord

RAW_PREFIX = "requests-"
SIDECAR_PREFIX = "worker-"
MERGES_FILE = "merges.jsonl"  # one line per merged worker, in the target's `background/`
# one line per start of a load that waited for workers on other hosts, in its state folder:
# how many; their records stay on their hosts until `compaction-bench load merge`
REMOTE_FILE = "remote.jsonl"


class MergeError(SuiteError):
    """Worker records that cannot be merged without losing or duplicating one."""


@dataclass(frozen=True)
class Anchor:
    """One shared moment on the worker's and the master's monotonic clocks (module docstring)."""

    worker_s: float  # worker's time.monotonic() when the setup message arrived
    master_sent_s: float  # master's time.monotonic() when it sent that message
    master_back_s: float  # master's time.monotonic() when the worker's answer came back
    worker_wall_s: float = 0.0  # time.time() beside them, for audit only
    master_wall_s: float = 0.0

    @property
    def offset_s(self) -> float:
        """Add to a worker time to get the master time."""
        return (self.master_sent_s + self.master_back_s) / 2 - self.worker_s

    @property
    def precision_s(self) -> float:
        """The anchor's worst-case error: half the round trip."""
        return (self.master_back_s - self.master_sent_s) / 2


@dataclass(frozen=True)
class WorkerFiles:
    name: str
    raw: Path
    sidecar: Path


def worker_files(folder: Path, name: str) -> WorkerFiles:
    return WorkerFiles(name, folder / f"{RAW_PREFIX}{name}.jsonl",
                       folder / f"{SIDECAR_PREFIX}{name}.json")


def write_sidecar(files: WorkerFiles, **fields: Any) -> None:
    """The worker's sidecar, whole (atomic): identity, `anchor`, `origin_s`, `records`,
    `stopped`."""
    write_json_atomic(files.sidecar, {"worker": files.name, **fields}, durable=False)


def find_workers(folders: list[Path]) -> list[WorkerFiles]:
    """Every worker in `folders` (a sidecar or a raw file names one)."""
    found: dict[tuple[Path, str], WorkerFiles] = {}
    for folder in folders:
        if not folder.is_dir():
            raise MergeError(f"{folder}: no such folder of worker records (give the folder a "
                             "worker wrote with --out, copied from its host)")
        for path in sorted(folder.iterdir()):
            for prefix, suffix in ((RAW_PREFIX, ".jsonl"), (SIDECAR_PREFIX, ".json")):
                if path.name.startswith(prefix) and path.name.endswith(suffix):
                    name = path.name[len(prefix):-len(suffix)]
                    found[(folder, name)] = worker_files(folder, name)
    return list(found.values())


@dataclass(frozen=True)
class MergedWorker:
    name: str
    host: str
    records: int
    users: tuple[int, ...]
    offset_s: float
    precision_s: float


def _load_worker(files: WorkerFiles, allow_unfinished: bool
                 ) -> tuple[dict[str, Any], Anchor, list[tuple[int, RequestRecord]]]:
    import json

    try:
        side = json.loads(files.sidecar.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeError(f"{files.sidecar}: missing: every raw file needs its worker's sidecar "
                         "(copy both files of the worker)") from None
    except ValueError as exc:
        raise MergeError(f"{files.sidecar}: not JSON ({exc})") from None
    if not isinstance(side.get("anchor"), dict):
        raise MergeError(f"{files.sidecar}: no clock anchor: the worker never got the master's "
                         "setup message, so its records cannot be placed on the run's timeline")
    anchor = Anchor(**side["anchor"])
    read = read_jsonl(files.raw)
    if read.issues:
        issue = read.issues[0]
        raise MergeError(f"{files.raw}: line {issue.line}: {issue.reason} (a record was cut; "
                         "nothing was merged)")
    rows = []
    for line, row in read.rows:
        try:
            fields = {k: v for k, v in row.items() if k != "schema"}
            fields["chunk_times_s"] = tuple(fields.get("chunk_times_s") or ())
            rows.append((line, RequestRecord(**fields)))
        except TypeError as exc:
            raise MergeError(f"{files.raw}: line {line}: not a request record ({exc})") from None
    if not side.get("stopped"):
        if not allow_unfinished:
            raise MergeError(
                f"{files.sidecar}: the worker did not stop cleanly, so how many records it "
                f"wrote is unknown ({len(rows)} in its file); stop workers with SIGTERM or "
                "Ctrl-C, or merge what is there with allow_unfinished=1")
    elif int(side.get("records", -1)) != len(rows):
        written = int(side.get("records", -1))
        what = "lost" if written > len(rows) else "duplicated or added"
        raise MergeError(f"{files.raw}: {len(rows)} records, but the worker wrote {written}: "
                         f"{abs(written - len(rows))} {what}; nothing was merged")
    return side, anchor, rows


def _number(record: RequestRecord, where: str) -> tuple[int, int]:
    """(user, request number) of a background request id `bg-<user>-<number>`."""
    parts = record.request_id.split("-")
    if len(parts) != 3 or parts[0] != "bg" or not (parts[1].isdigit() and parts[2].isdigit()):
        raise MergeError(f"{where}: request id {record.request_id!r} is no background id "
                         "bg-<user>-<number>")
    return int(parts[1]), int(parts[2])


def merge_workers(folders: list[Path], out: Path, *, allow_unfinished: bool = False,
                  expected_workers: int | None = None, remote: bool = True
                  ) -> list[MergedWorker]:
    """Check every worker of `folders` (module docstring), then append their records to `out`
    in send order, on the run's timeline; returns what was merged per worker. `remote`: the
    folders were copied here (`load merge`), not a load's own local workers; `merges.jsonl`
    says which, so `pending_remote` can count what is still on other hosts."""
    workers = find_workers(folders)
    if expected_workers is not None and len(workers) != expected_workers:
        raise MergeError(f"{', '.join(str(f) for f in folders)}: {len(workers)} workers' "
                         f"records, {expected_workers} expected (a worker's files are missing)")
    # (worker, id) already merged; ids alone repeat across a resumed run's starts of the load
    taken = {((r.get("labels") or {}).get("worker"), r.get("request_id"))
             for r in read_jsonl(out).objects if r.get("source") == "background"}
    seen: dict[str, Path] = {}
    owner: dict[int, Path] = {}
    merged: list[MergedWorker] = []
    shifted: list[RequestRecord] = []
    origins: set[float] = set()
    for files in workers:
        side, anchor, rows = _load_worker(files, allow_unfinished)
        origins.add(float(side.get("origin_s", 0.0)))
        numbers: dict[int, list[int]] = defaultdict(list)
        for line, record in rows:
            where = f"{files.raw}: line {line}"
            if (files.name, record.request_id) in taken:
                raise MergeError(f"{where}: {record.request_id} is already in {out} (this "
                                 "worker was merged before?); nothing was merged")
            if record.request_id in seen:
                raise MergeError(f"{where}: {record.request_id} duplicated (also in "
                                 f"{seen[record.request_id]}); nothing was merged")
            seen[record.request_id] = files.raw
            user, number = _number(record, where)
            if owner.setdefault(user, files.raw) != files.raw:
                raise MergeError(f"{where}: user {user} also sent from {owner[user]}: one agent "
                                 "split across workers; nothing was merged")
            numbers[user].append(number)
        for user, got in numbers.items():
            missing = sorted(set(range(max(got) + 1)) - set(got))
            if missing:
                raise MergeError(f"{files.raw}: user {user} request bg-{user}-{missing[0]} "
                                 f"missing ({len(missing)} of {max(got) + 1} lost); nothing "
                                 "was merged")
        origin = float(side.get("origin_s", 0.0))
        shift = origin - anchor.offset_s  # worker time - shift = time since the run's start
        shifted += [dataclasses.replace(r.shifted(shift), labels={
            **r.labels, "worker": files.name}) for _, r in rows]
        merged.append(MergedWorker(files.name, str(side.get("host", "")), len(rows),
                                   tuple(sorted(numbers)), anchor.offset_s, anchor.precision_s))
    if len(origins) > 1:
        raise MergeError(f"{', '.join(str(f) for f in folders)}: workers of different runs "
                         f"(run starts {sorted(origins)}); merge one run's workers at a time")
    writer = JsonlWriter(out)
    try:
        for record in sorted(shifted, key=lambda r: r.sent_s):
            writer.write(record.to_json())
    finally:
        writer.close()
    log = JsonlWriter(out.parent / "background" / MERGES_FILE)
    try:
        for worker in merged:
            log.write({**dataclasses.asdict(worker), "remote": remote})
    finally:
        log.close()
    return merged


@dataclass(frozen=True)
class RemotePending:
    """Remote workers a load waited for (every start, `remote.jsonl`) against those merged
    from copied folders (`merges.jsonl`, `remote`)."""

    expected: int
    merged: int

    @property
    def pending(self) -> int:
        return max(0, self.expected - self.merged)


def pending_remote(state_dir: Path) -> RemotePending:
    """How many remote workers' records are not in the run's requests file yet: their
    background requests are missing from every count until `compaction-bench load merge`."""
    expected = sum(int(r.get("remote_workers", 0))
                   for r in read_jsonl(state_dir / REMOTE_FILE).objects)
    merged = sum(bool(r.get("remote")) for r in read_jsonl(state_dir / MERGES_FILE).objects)
    return RemotePending(expected, merged)
