"""Recorded-token figures of a paired recorded continuation, and where it sits among the study's
screens.

A replay source is one fork recorded twice: a clean branch (original reasoning) and a rewritten
branch (the same history with its reasoning rewritten), each continued by the model for a few
turns. In our history format each branch is one file (`clean.json`, `external.json` for the
study's records) whose `continuation` holds every postfork assistant turn with its
`extra.usage` and `extra.wall_seconds`. Everything here is computed from those two files only,
never from the study's raw layout, so any imported trace with per-turn usage works.

Per branch: postfork turns, prompt/completion/reasoning tokens summed over them, reasoning words
(whitespace-split words of each turn's native `reasoning` text, as the study counts them) and
wall seconds. Paired changes are the study's `pair` (its `continue_frozen_source`): the percent
change of the branch aggregates, (rewritten - clean) / clean * 100, computed in exactly that
order so that it reproduces the study's floats bit for bit, and None unless the horizon is
comparable: both branches reached a completed status with the same number of turns. A branch
that stopped early (an action failure) reasons over a shorter horizon, so its totals are not
comparable.

The study's two screens (`data/study/screens.json`, see data/study/SOURCES.md) hold the same
figures for all 108 cases without the messages; `place` ranks a record among its model's cases.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.common.paths import histories_root, study_root
from compaction_bench.histories.format.history import History, HistoryError, load_history

# What a branch's status says when it ran to its end: the study's "complete"; mini-swe-agent's
# exit status "Submitted" for an imported trace.
COMPLETED = frozenset({"complete", "submitted"})
# The study's `pair` keys and the branch aggregate each is the change of.
PAIR_METRICS = {"reasoning_token_change_percent": "reasoning_tokens",
                "completion_token_change_percent": "completion_tokens",
                "prompt_token_change_percent": "prompt_tokens",
                "reasoning_word_change_percent": "reasoning_words"}


@dataclass(frozen=True)
class BranchFigures:
    """One branch's recorded postfork turns, summed."""

    arm: str
    status: str | None  # the branch's terminal status where the file says it
    turns: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    reasoning_words: int
    wall_seconds: float
    reasoning_tokens_by_turn: tuple[int, ...]


@dataclass(frozen=True)
class RecordedFigures:
    """The recorded figures of one fork: both branches, the paired changes (in percent) and,
    where the file carries it, the study's own `pair` to compare them with."""

    name: str
    task: str
    model: str | None  # the recorded route, e.g. "deepseek/deepseek-v4-flash"
    model_name: str | None  # the study's short name, e.g. "deepseek-v4-flash"
    replicate: int | None
    continuation_seed: int | None
    providers: tuple[str, ...]  # who served the recorded responses (hosted APIs in the study)
    hardware: str | None  # the study's records do not say
    clean: BranchFigures
    rewritten: BranchFigures
    comparable_horizon: bool | None  # None: a branch's status is unknown, so it is unchecked
    changes: Mapping[str, float | None]  # PAIR_METRICS keys
    recorded_pair: Mapping[str, Any] | None

    def pair_mismatches(self, tolerance_pp: float = 0.01) -> list[str]:
        """One line per recorded `pair` figure this record does not reproduce (a None on one
        side only is a mismatch); [] when all agree within `tolerance_pp` percentage points."""
        if self.recorded_pair is None:
            return [f"{self.name}: no recorded pair to compare with"]
        wrong = []
        if self.recorded_pair.get("comparable_horizon") != self.comparable_horizon:
            wrong.append(f"{self.name}: comparable_horizon {self.comparable_horizon} vs "
                         f"recorded {self.recorded_pair.get('comparable_horizon')}")
        for key, recorded in self.recorded_pair.items():
            if key not in PAIR_METRICS:
                continue
            computed = self.changes[key]
            if (computed is None) != (recorded is None) or (
                    computed is not None and abs(computed - recorded) > tolerance_pp):
                wrong.append(f"{self.name}: {key} {computed} vs recorded {recorded}")
        return wrong


def percent_change(clean: float, rewritten: float) -> float | None:
    """The study's paired change; None where the clean figure is 0 (no base to compare to)."""
    return (rewritten - clean) / clean * 100 if clean else None


def branch_figures(history: History, *, origin: str) -> BranchFigures:
    """Sum a branch's postfork assistant turns; each must carry `extra.usage`."""
    prompt = completion = words = 0
    wall = 0.0
    reasoning: list[int] = []
    for index, message in enumerate(history.continuation):
        if message.get("role") != "assistant":
            continue
        extra = message.get("extra") or {}
        where = f"continuation message {index}"
        usage = extra.get("usage")
        if not isinstance(usage, dict) or not all(
                isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
            raise HistoryError(f"{origin}: {where}: field 'extra.usage': needs integer "
                               "prompt_tokens and completion_tokens (import the trace with its "
                               "per-turn usage)")
        details = usage.get("completion_tokens_details") or {}
        thought = details.get("reasoning_tokens", usage.get("reasoning_tokens", 0))
        seconds = extra.get("wall_seconds")
        if not isinstance(thought, int):
            raise HistoryError(f"{origin}: {where}: field 'extra.usage.completion_tokens_"
                               f"details.reasoning_tokens': {thought!r} is not an integer")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise HistoryError(f"{origin}: {where}: field 'extra.wall_seconds': {seconds!r} is "
                               "not a number of seconds (the recorded turn's wall time)")
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
        reasoning.append(thought)
        words += len((message.get("reasoning") or "").split())
        wall += float(seconds)
    if not reasoning:
        raise HistoryError(f"{origin}: field 'continuation': no recorded postfork assistant "
                           "turn; a replay source needs the recorded continuation")
    return BranchFigures(arm=history.arm, status=_status(history), turns=len(reasoning),
                         prompt_tokens=prompt, completion_tokens=completion,
                         reasoning_tokens=sum(reasoning), reasoning_words=words,
                         wall_seconds=wall, reasoning_tokens_by_turn=tuple(reasoning))


def recorded_figures(clean: History, rewritten: History, *, name: str = "",
                     origin: str = "") -> RecordedFigures:
    """The figures of one fork from its clean and rewritten histories."""
    origin = origin or name or clean.task
    if clean.task != rewritten.task:
        raise HistoryError(f"{origin}: field 'task': clean is '{clean.task}', rewritten is "
                           f"'{rewritten.task}'; pass the two branches of one fork")
    a = branch_figures(clean, origin=f"{origin} ({clean.arm})")
    b = branch_figures(rewritten, origin=f"{origin} ({rewritten.arm})")
    comparable = None if a.status is None or b.status is None else (
        a.status.lower() in COMPLETED and b.status.lower() in COMPLETED and a.turns == b.turns)
    changes = {key: None if comparable is False else percent_change(getattr(a, metric),
                                                                    getattr(b, metric))
               for key, metric in PAIR_METRICS.items()}
    study = clean.provenance.get("study") or {}
    served = {str(m["extra"]["provider"]) for h in (clean, rewritten) for m in h.continuation
              if m.get("role") == "assistant" and (m.get("extra") or {}).get("provider")}
    hardware = clean.provenance.get("hardware")
    pair = study.get("pair")
    return RecordedFigures(
        name=name or clean.task, task=clean.task, model=_text(clean.provenance.get("model")),
        model_name=_text(study.get("model_name")), replicate=_int(study.get("replicate")),
        continuation_seed=_int(study.get("continuation_seed")), providers=tuple(sorted(served)),
        hardware=hardware if isinstance(hardware, str) else None, clean=a, rewritten=b,
        comparable_horizon=comparable, changes=changes,
        recorded_pair=pair if isinstance(pair, dict) else None)


def replay_sources(root: str | Path | None = None) -> list[Path]:
    """The shipped replay sources: every `<histories>/study/<record>/` holding both branches."""
    base = Path(root) if root is not None else histories_root()
    return sorted(p for p in (base / "study").glob("*/")
                  if (p / "clean.json").is_file() and (p / "external.json").is_file())


def figures_for(folder: str | Path) -> RecordedFigures:
    """The figures of one replay source folder (`clean.json` + `external.json`)."""
    folder = Path(folder)
    return recorded_figures(load_history(folder / "clean.json"),
                            load_history(folder / "external.json"), name=folder.name,
                            origin=str(folder))


def _status(history: History) -> str | None:
    outcome = (history.provenance.get("study") or {}).get("outcome") or {}
    status = outcome.get("status", history.info.get("exit_status"))
    return status if isinstance(status, str) and status else None  # "": not recorded


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- the study's screens ---------------------------------------------------------------------

CASE_FIELDS = {"screen": str, "model": str, "task": str, "replicate": int, "seed": int,
               "comparable_horizon": bool, "clean_success": bool, "rewritten_success": bool,
               "clean_prompt_tokens": int, "rewritten_prompt_tokens": int,
               "clean_reasoning_tokens": int, "rewritten_reasoning_tokens": int}
CASE_CHANGES = ("reasoning_token_change_percent", "prompt_token_change_percent")
KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false"}


@dataclass(frozen=True)
class ScreenCase:
    """One case of the study's screens: its token figures (summed over the postfork turns of
    each branch) and the paired changes as the screen published them (None where the horizon
    is not comparable)."""

    screen: str
    model: str
    task: str
    replicate: int
    seed: int
    comparable_horizon: bool
    clean_success: bool
    rewritten_success: bool
    clean_prompt_tokens: int
    rewritten_prompt_tokens: int
    clean_reasoning_tokens: int
    rewritten_reasoning_tokens: int
    reasoning_token_change_percent: float | None
    prompt_token_change_percent: float | None


@dataclass(frozen=True)
class Placement:
    """Where a record's reasoning-token change falls among its model's comparable cases."""

    name: str
    model: str
    value: float | None
    cases: int  # the model's cases with a comparable horizon
    percentile: float | None  # mid-rank: share below plus half the ties, in percent
    median: float | None
    case: ScreenCase | None  # the record's own case in the screens, where it is one


def screen_cases(path: str | Path | None = None) -> list[ScreenCase]:
    """Every case of `data/study/screens.json` (or `path`), validated field by field."""
    path = Path(path) if path is not None else study_root() / "screens.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HistoryError(f"{path}: cannot read the screens file ({exc}); restore it from "
                           "the checkout (data/study/screens.json)") from exc
    raw = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw:
        raise HistoryError(f"{path}: field 'cases': must be a non-empty list of case objects")
    cases = []
    for index, case in enumerate(raw):
        where = f"{path}: case {index}"
        if not isinstance(case, dict):
            raise HistoryError(f"{where}: must be an object")
        for key, kind in CASE_FIELDS.items():
            value = case.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise HistoryError(f"{where}: field '{key}': {value!r} is not "
                                   f"{KIND_NAMES[kind]}")
        for key in CASE_CHANGES:
            value = case.get(key)
            if value is not None and (not isinstance(value, int | float)
                                      or isinstance(value, bool)):
                raise HistoryError(f"{where}: field '{key}': {value!r} is not a number or "
                                   "null")
        cases.append(ScreenCase(**{k: case[k] for k in (*CASE_FIELDS, *CASE_CHANGES)}))
    return cases


def place(figures: RecordedFigures, cases: list[ScreenCase]) -> Placement:
    """Rank a record's reasoning-token change among its model's comparable screen cases."""
    model = figures.model_name or (figures.model or "").rsplit("/", 1)[-1]
    value = figures.changes["reasoning_token_change_percent"]
    peers = sorted(c.reasoning_token_change_percent for c in cases if c.model == model
                   and c.comparable_horizon and c.reasoning_token_change_percent is not None)
    own = next((c for c in cases if (c.model, c.task, c.replicate)
                == (model, figures.task, figures.replicate)), None)
    percentile = median = None
    if peers:
        middle = len(peers) // 2
        median = peers[middle] if len(peers) % 2 else (peers[middle - 1] + peers[middle]) / 2
        if value is not None:
            below = sum(p < value for p in peers)
            ties = sum(p == value for p in peers)
            percentile = 100 * (below + ties / 2) / len(peers)
    return Placement(name=figures.name, model=model, value=value, cases=len(peers),
                     percentile=percentile, median=median, case=own)
