"""The study's own B300 figures (paper Appendix E.2, Table 12) reproduced from its raw blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.analysis.study import StudySourceError, default_source, import_study
from compaction_bench.bench.report.run_report import report_study
from compaction_bench.common.paths import data_root, repo_root

# Published figures, in percent (paired median change vs clean) and seconds.
TARGETS = {
    ("pooled", "self"): -25.40,
    ("pooled", "external"): -18.54,
    ("dedicated", "self"): -25.39,
    ("dedicated", "external"): -26.76,
    ("shared", "self"): -25.41,
    ("shared", "external"): -8.56,
    ("overloaded", "self"): -23.40,
    ("overloaded", "external"): -26.07,
}
SENSITIVITY_TARGETS = {"self": -23.40, "external": -26.36}  # published as -23.4 and -26.4
STUDY_ARM = {"external": "luna", "self": "self"}


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("study") / "study-b300"
    files = report_study(default_source(), out)
    loaded: dict[str, Any] = json.loads(files.summary.read_text())
    return loaded


def _comparison(summary: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = summary["pooled"] if name == "pooled" else summary["regimes"][name]
    return found


@pytest.mark.parametrize(("name", "arm"), sorted(TARGETS))
def test_primary_figures_match_the_paper(summary: dict[str, Any], name: str, arm: str) -> None:
    entry = _comparison(summary, name)["arms"][arm]
    assert entry["paired_median_change_pct"] == pytest.approx(TARGETS[(name, arm)], abs=0.01)


def test_block_counts_and_shares(summary: dict[str, Any]) -> None:
    pooled = summary["pooled"]
    assert pooled["regimes"] == ["dedicated", "shared"]
    assert pooled["blocks_complete"] == 10
    assert (pooled["arms"]["self"]["n_faster"], pooled["arms"]["external"]["n_faster"]) == (10, 9)
    overloaded = summary["regimes"]["overloaded"]
    assert overloaded["blocks_complete"] == 23
    assert overloaded["arms"]["clean"]["median_postfork_s"] == pytest.approx(154.5, abs=0.05)
    assert sorted(b["block"] for b in overloaded["blocks_unusable"]) == [2, 17]
    reasons = {(f["arm"], f["reason"]) for f in summary["failures"]}
    assert reasons == {
        ("clean", "ProtocolError: expected exactly one tool call, got 2"),
        ("self", "ProtocolError: invalid tool 'edit'"),
    }


def test_retry_augmented_sensitivity(summary: dict[str, Any]) -> None:
    overloaded = summary["sensitivity"]["regimes"]["overloaded"]
    assert overloaded["blocks_complete"] == 25
    assert {(s["block"], s["arm"]) for s in overloaded["substitutions"]} == {
        (2, "clean"), (17, "self")}
    for arm, target in SENSITIVITY_TARGETS.items():
        change = overloaded["arms"][arm]["paired_median_change_pct"]
        assert change == pytest.approx(target, abs=0.01)
    assert round(overloaded["arms"]["external"]["paired_median_change_pct"], 1) == -26.4


def test_agrees_with_the_studys_own_analysis_file(summary: dict[str, Any]) -> None:
    """Full-precision cross-check against b300_analysis.json, shipped beside the blocks."""
    study = json.loads((default_source().parent / "b300_analysis.json").read_text())[
        "b300_latency"]
    selections = [
        (summary["regimes"], study["original_10"]["regimes"]),
        (summary["regimes"], study["overload_primary_23"]["regimes"]),
        (summary["sensitivity"]["regimes"], study["overload_retrospective_25"]["regimes"]),
    ]
    for ours, theirs in selections:
        for regime, published in theirs.items():
            assert ours[regime]["blocks_complete"] == published["pairs"]
            for arm, name in STUDY_ARM.items():
                figures = published["arms"][name]
                entry = ours[regime]["arms"][arm]
                assert entry["paired_median_change_pct"] == pytest.approx(
                    figures["median_paired_complete_task_change_percent"], abs=1e-9)
                assert [entry["n_faster"], entry["n_equal"], entry["n_slower"]] == figures[
                    "faster_equal_slower"]
                assert ours[regime]["arms"]["clean"]["median_postfork_s"] == pytest.approx(
                    figures["normal_median_complete_task_seconds"], abs=1e-9)


def test_study_report_states_the_figures(summary: dict[str, Any], tmp_path: Path) -> None:
    files = report_study(default_source(), tmp_path / "study-b300")
    text = files.markdown.read_text()
    for figure in ("-25.40%", "-18.54%", "-23.40%", "-26.07%", "-26.36%", "154.5 s (n=23)",
                   "10/10", "9/10"):
        assert figure in text


def test_missing_source_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "b300_blocks.json"
    with pytest.raises(StudySourceError, match=str(missing)):
        import_study(missing, tmp_path / "out")


def test_the_study_data_ships_inside_the_project() -> None:
    """A user's clone has no ../shared: the default source is the project's own copy."""
    assert default_source().resolve().is_relative_to(data_root().resolve())
    assert data_root().resolve().is_relative_to(repo_root().resolve())


@pytest.mark.e2e
def test_report_study_runs_from_anywhere(tmp_path: Path) -> None:
    """`make report-study` as a user runs it: from another folder, nothing beside the repo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPBENCH_")}
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "study", "report", "--out",
         str(tmp_path / "s")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        env={**env, "COMPBENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "s" / "report.md").read_text()
    assert "-25.40%" in text and "-18.54%" in text
