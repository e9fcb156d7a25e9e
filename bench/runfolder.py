"""The raw records of a run folder (line schema 2; schema-1 lines still read) and how they are
read and written: the one schema that the run (bench/run, which writes it) and the analysis
(bench/analysis, which reads it) both import.

A run folder `results/<run-id>/` holds `manifest.json`, `arms.jsonl`, `requests.jsonl`,
`metrics.jsonl` and `blocks.jsonl`; `bench/analysis/summary_schema.md` documents every field.
Writers append one JSON object per line as things happen (`common.files.JsonlWriter`), so a crash
loses at most the line in flight.

Reading never raises on bad content: a missing file, a line cut mid-JSON, a line with a missing
or mistyped field is skipped and kept as a `LoadIssue` (file, line, reason, and the regime/block/arm
where the broken line still names them), so the report can say which blocks could not be used and
why. Only a run folder that does not exist at all raises `RunFolderError`.
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import SCHEMA, write_json_atomic, write_text_atomic
from compaction_bench.common.files import read_jsonl as read_lines
from compaction_bench.transport.client import RequestRecord

SCHEMA_VERSION = SCHEMA
READABLE_SCHEMAS = (1, SCHEMA)  # schema 1 lines (older runs) read the same; new fields absent
REFERENCE_ARM = "clean"
REGIME_ORDER = ("dedicated", "shared", "overloaded")

MANIFEST_FILE = "manifest.json"
ARMS_FILE = "arms.jsonl"
REQUESTS_FILE = "requests.jsonl"
METRICS_FILE = "metrics.jsonl"
BLOCKS_FILE = "blocks.jsonl"
LOAD_FILE = "load.jsonl"
PHASES_FILE = "phases.jsonl"


class AnalysisError(SuiteError):
    """Base class of every error analysis raises on bad input; the message names the fix."""


class RunFolderError(AnalysisError):
    """A run folder does not exist or is not a folder."""


CENSORED = "TimeExceeded"  # the terminal status of an arm stopped at the wall limit


@dataclass(frozen=True)
class ArmRecord:
    """One attempt of one arm in one block. Times are seconds on the run's monotonic clock.

    `postfork_s` is the postfork marginal time; `rewrite_s` is recorded beside it (None where it
    was not measured, as in imported study records). `attempt` is "original" or "recovery".
    """

    regime: str
    block: int
    arm: str
    attempt: str
    status: str
    postfork_s: float
    error: str | None = None
    rewrite_s: float | None = None
    turns: int | None = None
    terminal_status: str | None = None
    reasoning_tokens: int | None = None
    completion_tokens: int | None = None
    history_tokens: int | None = None
    validation: bool | None = None
    validation_tail: str | None = None  # the last 1,000 characters of the validation's output
    protocol_ok: bool | None = None
    started_s: float | None = None
    ended_s: float | None = None
    # schema 2 (all optional): the repeat, the cache and rewrite costs, the protocol, the wire
    seed: int | None = None  # the base sampling seed of this attempt (request k sends seed + k)
    cache_mode: str | None = None  # shared | isolated
    cache_salt: str | None = None
    fork_prompt_tokens: int | None = None  # the first postfork request's prompt tokens...
    fork_cached_tokens: int | None = None  # ...and how many of them came from the cache
    fork_cache_state: str | None = None  # cold | partial | warm
    first_request_s: float | None = None  # when the first postfork request was sent
    setup_s: float | None = None
    # seconds this attempt waited for a compressor server's lazy start (None: it did not);
    # excluded from postfork_s and rewrite_s, and the block is marked invalid when it is long
    helper_wait_s: float | None = None
    error_phase: str | None = None  # setup | run | patch | validation | policy | invariant
    protocol: str | None = None  # strict | lenient
    format_errors: int | None = None
    reasoning_source: str | None = None  # server-usage | tokenizer | recorded (replay)
    rewrite_requests: int | None = None  # compressor requests during the continuation
    rewrite_cache_hits: int | None = None
    rewrite_prompt_tokens: int | None = None
    rewrite_cached_tokens: int | None = None  # of them from the prefix cache (self-inline)
    rewrite_completion_tokens: int | None = None
    rewrite_failed_blocks: int | None = None
    fork_rewrite_s: float | None = None  # the one-time compaction of the fork prefix (T_R)
    fork_rewrite_requests: int | None = None
    fork_rewrite_prompt_tokens: int | None = None
    fork_rewrite_completion_tokens: int | None = None
    fork_rewrite_cache_hits: int | None = None
    invariant: dict[str, Any] | None = None  # body hashes, reasoning and factor fields
    block_pass: int | None = None  # 2+ for a block run again after a crash cut it (None: 1)
    # the load-response sweep (regime "sweep", bench/run/sweep.py); None elsewhere
    level: int | None = None  # the fleet size N this continuation ran among
    sweep_agent: int | None = None  # which of the N agents (0-based)
    sweep_index: int | None = None  # the agent's k-th continuation in its level (0-based)
    sweep_phase: str | None = None  # warmup | measured | drain (only measured ones are planned)
    # replay (SOURCE=replay, loadgen/replay.py); None for live agents
    source: str | None = None  # agent | replay
    record: str | None = None  # the replay source (the recorded fork) this attempt replayed
    continuation: str | None = None  # recorded (its own recorded turns) | history-only
    forced_requests: int | None = None  # requests sent with a forced (recorded) length...
    forced_exact: int | None = None  # ...and how many came back at exactly that length
    recorded_completion_tokens: int | None = None  # the recorded turns' output, summed
    recorded_postfork_s: float | None = None  # the recording's own request wall time, summed
    tool_wait_s: float | None = None  # recorded tool time waited between turns

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def censored(self) -> bool:
        """Stopped by the arm wall limit (`arm_wall_s`): its status is complete but its time
        and tokens are lower bounds of the true ones."""
        return self.terminal_status == CENSORED

    @property
    def failure_reason(self) -> str:
        """The error string where there is one, else the terminal status, else the status."""
        return self.error or self.terminal_status or self.status


@dataclass(frozen=True)
class MetricSample:
    """One scrape of the server's /metrics. Counters are cumulative since server start."""

    t_s: float
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    num_preemptions: float | None = None
    # vllm:request_success_total: requests the server finished (a dedicated block's load
    # verdict compares its rise with the run's own requests)
    requests_finished: float | None = None


@dataclass(frozen=True)
class BlockRecord:
    """One block: its regime, number, arms' randomized start order and its span; the block's
    seed, its load figures and, where the load was not what the regime says, why the block is
    invalid (it stays on record and out of the primary analysis)."""

    regime: str
    block: int
    order: tuple[str, ...] = ()
    started_s: float | None = None
    ended_s: float | None = None
    seed: int | None = None  # clean's sampling seed in this block (each arm's: its own record)
    released_s: float | None = None  # when the arms were released together, after setup
    load: dict[str, Any] | None = None
    invalid_reasons: tuple[str, ...] = ()
    block_pass: int | None = None  # which pass of the block this record closes (None: 1)
    record: str | None = None  # replay: the recorded fork this block replayed
    # whether other processes on this host used its CPUs while the block ran: the verdict of
    # bench/analysis/host.py over host.jsonl (quiet, contended with the figure, or unknown)
    host: dict[str, Any] | None = None


@dataclass(frozen=True)
class LoadSample:
    """The background load's state, sampled by the bench about twice a second (`load.jsonl`)."""

    t_s: float
    running: bool
    block: int | None = None
    users: int | None = None
    started: int | None = None
    answered: int | None = None
    in_flight: int | None = None
    done: int | None = None
    ok: int | None = None
    errors: int | None = None
    unauthorized: int | None = None
    last_ok_age_s: float | None = None


@dataclass(frozen=True)
class PhaseRecord:
    """One stretch of a run outside the blocks (`phases.jsonl`, appended as each ends): the
    server's start, the self-check, the service probe, the background's start. Times on the run
    clock; a resumed run appends its own."""

    phase: str
    started_s: float
    ended_s: float


@dataclass(frozen=True)
class LoadIssue:
    """A file or line that could not be used, with whatever identity the broken line still had."""

    file: str
    line: int | None
    reason: str
    regime: str | None = None
    block: int | None = None
    arm: str | None = None

    def where(self) -> str:
        return self.file if self.line is None else f"{self.file} line {self.line}"


@dataclass(frozen=True)
class RunRecords:
    """Everything read from one run folder, with the problems met while reading it."""

    run_id: str
    path: Path | None
    manifest: Mapping[str, Any]
    arms: tuple[ArmRecord, ...]
    requests: tuple[RequestRecord, ...] = ()
    metrics: tuple[MetricSample, ...] = ()
    blocks: tuple[BlockRecord, ...] = ()
    issues: tuple[LoadIssue, ...] = field(default=())
    load: tuple[LoadSample, ...] = ()
    phases: tuple[PhaseRecord, ...] = ()


# Fields a line must carry to be usable; every other field may be absent or null. Types come
# from each record's annotations.
_REQUIRED: dict[type[Any], tuple[str, ...]] = {
    ArmRecord: ("regime", "block", "arm", "attempt", "status", "postfork_s"),
    RequestRecord: ("regime", "source", "request_id", "sent_s", "status"),
    MetricSample: ("t_s",),
    BlockRecord: ("regime", "block"),
    LoadSample: ("t_s", "running"),
    PhaseRecord: ("phase", "started_s", "ended_s"),
}

R = TypeVar("R")


def _accepts(hint: Any, value: Any) -> tuple[bool, Any]:
    """Whether a JSON value fits an annotation, and the value to store (lists become tuples
    where the record holds a tuple). A bool where a number belongs is a writer bug: refused."""
    origin = get_origin(hint)
    if origin is types.UnionType or origin is Union:
        options = [h for h in get_args(hint) if h is not type(None)]
        for option in options:
            ok, stored = _accepts(option, value)
            if ok:
                return True, stored
        return False, value
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool), value
    if hint is str:
        return isinstance(value, str), value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return False, value
        item = get_args(hint)[0]
        stored = []
        for element in value:
            ok, kept = _accepts(item, element)
            if not ok:
                return False, value
            stored.append(kept)
        return True, tuple(stored)
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
    if origin is list:
        return isinstance(value, list), value
    return False, value


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(kind: type[Any]) -> dict[str, Any]:
    # resolving a record's annotations costs milliseconds; a run has thousands of lines
    if kind not in _HINTS:
        _HINTS[kind] = get_type_hints(kind)
    return _HINTS[kind]


def parse_record(kind: type[R], obj: Any) -> R:
    """Build a record of `kind` from one decoded JSON line; raise ValueError naming the field."""
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    schema = obj.get("schema")
    if schema not in READABLE_SCHEMAS:
        raise ValueError(f"schema is {schema!r}, this reader understands "
                         f"{', '.join(map(str, READABLE_SCHEMAS))}")
    hints = _hints(kind)
    values: dict[str, Any] = {}
    for name in _REQUIRED[kind]:
        if obj.get(name) is None:
            raise ValueError(f"missing field '{name}'")
    for name, hint in hints.items():
        value = obj.get(name)
        if value is None:
            continue
        ok, stored = _accepts(hint, value)
        if not ok:
            raise ValueError(f"field '{name}' has a value of the wrong type "
                             f"({type(value).__name__}: {str(value)[:40]!r})")
        values[name] = stored
    return kind(**values)


def _identity(obj: Any) -> dict[str, Any]:
    """The regime/block/arm a broken line still names, so its block can be reported."""
    if not isinstance(obj, dict):
        return {}
    regime, block = obj.get("regime"), obj.get("block")
    arm = obj.get("arm", obj.get("source"))
    return {
        "regime": regime if isinstance(regime, str) else None,
        "block": block if isinstance(block, int) and not isinstance(block, bool) else None,
        "arm": arm if isinstance(arm, str) else None,
    }


def read_records(
    path: Path, kind: type[R], *, required: bool = True
) -> tuple[tuple[R, ...], tuple[LoadIssue, ...]]:
    """Read every usable line of a JSONL file; bad lines become issues, never exceptions."""
    if not path.is_file():
        if not required:
            return (), ()
        return (), (LoadIssue(path.name, None, "file is missing"),)
    read = read_lines(path)
    records: list[R] = []
    issues = [LoadIssue(path.name, i.line, i.reason, **_identity(i.value)) for i in read.issues]
    for number, obj in read.rows:
        try:
            records.append(parse_record(kind, obj))
        except (ValueError, TypeError) as exc:
            issues.append(LoadIssue(path.name, number, str(exc), **_identity(obj)))
    issues.sort(key=lambda i: i.line or 0)
    return tuple(records), tuple(issues)


def load_manifest(path: Path) -> dict[str, Any]:
    """A run's manifest.json as an object; a missing, unreadable, non-UTF-8, broken or non-object
    file raises `RunFolderError` whose message starts with the path."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFolderError(f"{path}: file is missing") from None
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path}: not UTF-8 text (byte {exc.start}); restore it from a "
                             "copy, or start a new run") from None
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise RunFolderError(f"{path}: JSON nested too deeply") from None
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(loaded, dict):
        raise RunFolderError(f"{path}: not a JSON object")
    return loaded


def manifest_field(manifest: Mapping[str, Any], path: Path, name: str,
                   kinds: type | tuple[type, ...]) -> Any:
    """The manifest's field `name` (dotted: "config.regime") when it has one of `kinds`;
    else `RunFolderError` naming the file and the field."""
    value: Any = manifest
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if not isinstance(value, kinds) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        wanted = "/".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise RunFolderError(f"{path}: field '{name}' is missing or not a usable {wanted} "
                             f"(got {value!r:.40}); this manifest was not written by `make "
                             "bench` (start a new run instead of resuming this one)")
    return value


def read_run(path: Path) -> RunRecords:
    """Read a run folder. Raises RunFolderError only when the folder itself is absent."""
    if not path.is_dir():
        raise RunFolderError(
            f"{path}: no such run folder; pass a folder under results/ that holds arms.jsonl"
        )
    issues: list[LoadIssue] = []
    manifest: dict[str, Any] = {}
    try:
        manifest = load_manifest(path / MANIFEST_FILE)
    except RunFolderError as exc:
        issues.append(LoadIssue(MANIFEST_FILE, None,
                                str(exc).removeprefix(f"{path / MANIFEST_FILE}: ")))
    arms, arm_issues = read_records(path / ARMS_FILE, ArmRecord)
    # Imported study runs have no per-request or /metrics records; their absence is not a fault.
    requests, request_issues = read_records(path / REQUESTS_FILE, RequestRecord, required=False)
    metrics, metric_issues = read_records(path / METRICS_FILE, MetricSample, required=False)
    blocks, block_issues = read_records(path / BLOCKS_FILE, BlockRecord)
    load, load_issues = read_records(path / LOAD_FILE, LoadSample, required=False)
    phases, phase_issues = read_records(path / PHASES_FILE, PhaseRecord, required=False)
    issues += [*arm_issues, *request_issues, *metric_issues, *block_issues, *load_issues,
               *phase_issues]
    run_id = manifest.get("run_id")
    return RunRecords(
        run_id=run_id if isinstance(run_id, str) else path.name,
        path=path,
        manifest=manifest,
        arms=arms,
        requests=requests,
        metrics=metrics,
        blocks=blocks,
        issues=tuple(issues),
        load=load,
        phases=phases,
    )


def to_json_line(record: Any) -> str:
    """One record as a schema JSON line (no trailing newline)."""
    return json.dumps({"schema": SCHEMA_VERSION, **asdict(record)}, sort_keys=False)


def write_records(path: Path, records: Iterable[Any]) -> None:
    """Write a whole JSONL file of records atomically (importers; live writers append)."""
    write_text_atomic(path, "".join(to_json_line(r) + "\n" for r in records))


def write_json(path: Path, obj: Any) -> None:
    write_json_atomic(path, obj)


def regime_sort_key(regime: str) -> tuple[int, str]:
    """Known regimes in load order, then any others alphabetically."""
    if regime in REGIME_ORDER:
        return (REGIME_ORDER.index(regime), regime)
    return (len(REGIME_ORDER), regime)


def arm_sort_key(arm: str) -> tuple[int, str]:
    """clean first, then the seed arms, then other policies alphabetically."""
    seeds = (REFERENCE_ARM, "external", "self")
    return (seeds.index(arm), arm) if arm in seeds else (len(seeds), arm)


def sorted_unique(items: Iterable[str], key: Callable[[str], tuple[int, str]]) -> list[str]:
    return sorted(set(items), key=key)
