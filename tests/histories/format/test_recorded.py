"""Recorded-token figures of the shipped replay sources reproduce the study's own `pair`, and the
study's screens place them among all 108 cases."""

from __future__ import annotations

import copy
import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from compaction_bench.common.paths import histories_root, study_root
from compaction_bench.histories.format.history import History, HistoryError, load_history
from compaction_bench.histories.format.recorded import (
    ScreenCase,
    figures_for,
    percent_change,
    place,
    recorded_figures,
    replay_sources,
    screen_cases,
)

SOURCES = replay_sources()
WATER = histories_root() / "study" / "laguna-s-2.1__water-decision-v2__rep-01__seed-198000"


def pair(folder: Path) -> tuple[History, History]:
    return load_history(folder / "clean.json"), load_history(folder / "external.json")


def test_the_replay_sources_are_the_shipped_study_pairs() -> None:
    assert len(SOURCES) == 18  # data/study/records holds 18 records, each imported as a pair
    assert [p.name for p in SOURCES] == sorted(
        p.parent.name for p in (histories_root() / "study").glob("*/clean.json"))


@pytest.mark.parametrize("folder", SOURCES, ids=lambda p: p.name)
def test_computed_figures_reproduce_the_recorded_pair(folder: Path) -> None:
    figures = figures_for(folder)
    assert figures.recorded_pair is not None
    assert figures.pair_mismatches(tolerance_pp=0.01) == []
    assert figures.pair_mismatches(tolerance_pp=0.0) == []  # in fact the study's floats exactly
    # The branch sums are the study's own branch aggregates (kept in the provenance): every
    # recorded postfork turn was counted, and only those.
    for branch, history in zip((figures.clean, figures.rewritten), pair(folder), strict=True):
        aggregate = history.provenance["study"]["outcome"]["aggregate"]
        assert (branch.turns, branch.prompt_tokens, branch.completion_tokens,
                branch.reasoning_tokens, branch.reasoning_words) == (
            aggregate["turn_count"], aggregate["prompt_tokens"],
            aggregate["completion_tokens"], aggregate["reasoning_tokens"],
            aggregate["reasoning_words"])
        assert list(branch.reasoning_tokens_by_turn) == aggregate["reasoning_tokens_by_turn"]
        assert branch.wall_seconds == pytest.approx(aggregate["wall_seconds"], abs=1e-9)
        assert branch.status == history.provenance["study"]["outcome"]["status"]
    assert figures.model is not None and figures.model_name is not None
    assert figures.model.endswith("/" + figures.model_name)
    assert figures.providers in (("DeepInfra",), ("Poolside",))
    assert figures.hardware is None  # hosted APIs: the records name no hardware


def test_a_mutated_usage_value_breaks_the_equality() -> None:
    clean, external = pair(WATER)
    assert recorded_figures(clean, external, name="water").pair_mismatches() == []
    turn = next(m for m in external.continuation if m["role"] == "assistant")
    turn["extra"]["usage"]["completion_tokens_details"]["reasoning_tokens"] += 10
    wrong = recorded_figures(clean, external, name="water").pair_mismatches()
    assert len(wrong) == 1 and wrong[0].startswith("water: reasoning_token_change_percent ")
    turn["extra"]["usage"]["prompt_tokens"] += 1  # 1 token of 7017 moves it by 0.012 pp
    assert len(recorded_figures(clean, external, name="water").pair_mismatches()) == 2


def test_an_incomparable_horizon_gives_no_paired_change() -> None:
    folder = next(p for p in SOURCES if p.name.startswith("deepseek-v4-flash__atcoder-abc399_b"))
    figures = figures_for(folder)
    assert (figures.clean.status, figures.rewritten.status) == ("action_failure",
                                                                "action_failure")
    assert figures.comparable_horizon is False
    assert set(figures.changes.values()) == {None}
    assert figures.recorded_pair is not None and figures.recorded_pair[
        "reasoning_token_change_percent"] is None


def test_a_trace_without_a_status_still_gives_its_figures() -> None:
    clean, external = pair(WATER)
    for history in (clean, external):
        history.provenance = {"model": history.provenance["model"]}
    figures = recorded_figures(clean, external)
    assert figures.comparable_horizon is None and figures.recorded_pair is None
    assert figures.changes["reasoning_token_change_percent"] == percent_change(734, 384)
    assert figures.pair_mismatches() == [f"{figures.name}: no recorded pair to compare with"]


def test_percent_change_is_the_studys() -> None:
    assert percent_change(212, 208) == -1.8867924528301887  # the study's float, bit for bit
    assert percent_change(0, 5) is None


def test_a_turn_without_usage_is_refused_by_name() -> None:
    clean, external = pair(WATER)
    broken = copy.deepcopy(external)
    index = next(i for i, m in enumerate(broken.continuation) if m["role"] == "assistant")
    del broken.continuation[index]["extra"]["usage"]
    with pytest.raises(HistoryError) as caught:
        recorded_figures(clean, broken, origin="w")
    assert str(caught.value).startswith(f"w (external): continuation message {index}: field "
                                        "'extra.usage': needs integer prompt_tokens")
    broken = copy.deepcopy(external)
    broken.continuation[index]["extra"]["wall_seconds"] = None
    with pytest.raises(HistoryError, match=f"w \\(external\\): continuation message {index}: "
                       "field 'extra.wall_seconds': None is not a number"):
        recorded_figures(clean, broken, origin="w")
    broken.continuation = []
    with pytest.raises(HistoryError, match="w \\(external\\): field 'continuation': no recorded"):
        recorded_figures(clean, broken, origin="w")
    other = copy.deepcopy(external)
    other.task = "another-task"
    with pytest.raises(HistoryError, match="field 'task': clean is 'water-decision-v2', "
                       "rewritten is 'another-task'"):
        recorded_figures(clean, other, origin="w")


# --- the study's screens ---------------------------------------------------------------------

CASES = screen_cases()
SCREENS = json.loads((study_root() / "screens.json").read_text(encoding="utf-8"))


def test_the_screens_hold_all_108_cases_once() -> None:
    keys = [(c.screen, c.model, c.task, c.replicate) for c in CASES]
    assert len(keys) == len(set(keys)) == 108
    assert Counter(c.screen for c in CASES) == {"livecodebench-v6-12-item": 36,
                                                "v2-12-task-two-route": 72}
    replicates: dict[tuple[str, str, str], set[int]] = {}
    for c in CASES:
        replicates.setdefault((c.screen, c.model, c.task), set()).add(c.replicate)
    assert set(map(frozenset, replicates.values())) == {frozenset({1, 2, 3})}
    assert sorted((c.model, c.task, c.replicate) for c in CASES if not c.comparable_horizon) == [
        ("deepseek-v4-flash", "lcb-v6-atcoder-abc399_b", 1),
        ("deepseek-v4-flash", "lcb-v6-atcoder-abc399_b", 2),
        ("deepseek-v4-flash", "lcb-v6-atcoder-abc399_b", 3),
        ("laguna-s-2.1", "grid-decision-v2", 2),
        ("laguna-s-2.1", "manufacturing-recall-v2", 3),
        ("laguna-s-2.1", "rescue-decision-v2", 2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}/{c.task}/{c.replicate}")
def test_each_case_s_published_changes_follow_from_its_tokens(case: ScreenCase) -> None:
    # Every figure was transcribed, so this re-derivation is the check on the transcription.
    if case.comparable_horizon:
        assert case.reasoning_token_change_percent == percent_change(
            case.clean_reasoning_tokens, case.rewritten_reasoning_tokens)
        assert case.prompt_token_change_percent == percent_change(
            case.clean_prompt_tokens, case.rewritten_prompt_tokens)
    else:
        assert case.reasoning_token_change_percent is case.prompt_token_change_percent is None


@pytest.mark.parametrize(("screen", "model"), [
    (screen, model) for screen, models in SCREENS["published"].items() for model in models])
def test_the_cases_reproduce_each_screen_s_published_summary(screen: str, model: str) -> None:
    cases = [c for c in CASES if (c.screen, c.model) == (screen, model)]
    comparable = [c for c in cases if c.comparable_horizon]
    assert {
        "cases": len(cases), "comparable_cases": len(comparable),
        "clean_successes": sum(c.clean_success for c in cases),
        "rewritten_successes": sum(c.rewritten_success for c in cases),
        "reasoning_reduced_cases": sum(c.rewritten_reasoning_tokens < c.clean_reasoning_tokens
                                       for c in comparable),
        "median_reasoning_change_percent": statistics.median(
            c.reasoning_token_change_percent for c in comparable
            if c.reasoning_token_change_percent is not None),
        "comparable_pooled_reasoning_tokens": [
            sum(c.clean_reasoning_tokens for c in comparable),
            sum(c.rewritten_reasoning_tokens for c in comparable)],
        "comparable_pooled_prompt_tokens": [sum(c.clean_prompt_tokens for c in comparable),
                                            sum(c.rewritten_prompt_tokens for c in comparable)],
    } == SCREENS["published"][screen][model]


@pytest.mark.parametrize("folder", SOURCES, ids=lambda p: p.name)
def test_every_replay_source_is_its_own_case_in_the_screens(folder: Path) -> None:
    figures = figures_for(folder)
    placed = place(figures, CASES)
    case = placed.case
    assert case is not None and case.seed == figures.continuation_seed
    assert (case.clean_prompt_tokens, case.rewritten_prompt_tokens, case.clean_reasoning_tokens,
            case.rewritten_reasoning_tokens) == (
        figures.clean.prompt_tokens, figures.rewritten.prompt_tokens,
        figures.clean.reasoning_tokens, figures.rewritten.reasoning_tokens)
    assert case.reasoning_token_change_percent == figures.changes[
        "reasoning_token_change_percent"]
    assert case.prompt_token_change_percent == figures.changes["prompt_token_change_percent"]
    assert placed.cases == sum(c.model == placed.model and c.comparable_horizon for c in CASES)
    assert (placed.percentile is None) == (placed.value is None)


def _case(model: str, change: float | None, replicate: int) -> ScreenCase:
    """A case where only what `place` reads matters: model, horizon and reasoning change."""
    return ScreenCase(screen="s", model=model, task="t", replicate=replicate, seed=replicate,
                      comparable_horizon=change is not None, clean_success=True,
                      rewritten_success=True, clean_prompt_tokens=1, rewritten_prompt_tokens=1,
                      clean_reasoning_tokens=1, rewritten_reasoning_tokens=1,
                      reasoning_token_change_percent=change, prompt_token_change_percent=None)


def test_place_ranks_among_the_model_s_comparable_cases_only() -> None:
    figures = figures_for(WATER)  # laguna-s-2.1, reasoning change -47.68...
    value = figures.changes["reasoning_token_change_percent"]
    assert value is not None
    cases = [_case("laguna-s-2.1", -80.0, 1), _case("laguna-s-2.1", value, 2),
             _case("laguna-s-2.1", -10.0, 3), _case("laguna-s-2.1", 5.0, 4),
             _case("laguna-s-2.1", None, 5), _case("deepseek-v4-flash", -99.0, 6)]
    placed = place(figures, cases)
    # below: -80; tied: itself (half); of 4 comparable laguna cases -> 37.5 percent
    assert (placed.cases, placed.percentile, placed.median) == (4, 37.5, (value - 10.0) / 2)
    assert placed.case is None  # no case of water-decision-v2, replicate 1, in this list


def test_a_malformed_screens_file_is_refused_by_case_and_field(tmp_path: Path) -> None:
    data = copy.deepcopy(SCREENS)
    data["cases"][3]["clean_prompt_tokens"] = "4930"
    path = tmp_path / "screens.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(HistoryError) as caught:
        screen_cases(path)
    assert str(caught.value) == (f"{path}: case 3: field 'clean_prompt_tokens': '4930' is not "
                                 "an integer")
    path.write_text("{", encoding="utf-8")
    with pytest.raises(HistoryError, match="cannot read the screens file"):
        screen_cases(path)
