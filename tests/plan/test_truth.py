"""`make fleet-truth` (plan/truth.py): the fleet plan against fake replicas of known capacity
behind the real vllm-router, and its settings refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.plan.truth import (
    TruthConfig,
    TruthRow,
    profile_text,
    quantile_error_pct,
    truth_markdown,
    within,
)


def test_bad_settings_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="replicas \\[0\\]: each from 1 to 16"):
        TruthConfig(out=tmp_path, replicas=(0,))
    with pytest.raises(ValueError, match="kv-event-source"):
        TruthConfig(out=tmp_path, policies=("kv_aware",))
    with pytest.raises(ValueError, match="less than or equal to 1"):
        TruthConfig(out=tmp_path, cache_discount=1.5)
    with pytest.raises(ValueError, match="at least two fleet sizes"):
        TruthConfig(out=tmp_path, levels=(4,))
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        TruthConfig(out=tmp_path, slots=1)  # a profile's shared regime needs one user fewer


def test_the_profile_carries_the_engine_settings(tmp_path: Path) -> None:
    text = profile_text(TruthConfig(out=tmp_path, slots=3, prefill_ms_per_token=0.5,
                                    cache_discount=0.8, step_ms=3, step_ms_per_seq=0.5))
    assert "max_num_seqs = 3" in text and "shared_users = 2" in text
    from compaction_bench.serve.profile import load_profile

    path = tmp_path / "two.toml"
    path.write_text(profile_text(TruthConfig(out=tmp_path, slots=2)))
    assert load_profile(str(path)).regimes.shared_users == 1  # below its 2 slots
    assert '"--max-running", "3", "--prefill-ms-per-token", "0.5", "--cache-discount", "0.8"' in (
        text)


def _row(true: int | None, planned: int | None) -> TruthRow:
    return TruthRow("round_robin", 2, "clean", true, planned, None, None, None, None, 1.0, {})


def test_the_bar_is_five_percent_or_exact_for_small_fleets() -> None:
    assert within(_row(4, 4)) and not within(_row(4, 5)) and not within(_row(4, 3))
    assert within(_row(40, 42)) and not within(_row(40, 43))
    assert not within(_row(None, 4)) and not within(_row(4, None))


def test_the_truths_range_is_what_the_measured_intervals_can_tell_apart() -> None:
    row = _row(4, 5)
    row.intervals.update({3: (2.0, 2.5), 4: (2.3, 2.9), 5: (2.5, 3.1), 6: (2.8, 3.5)})
    row.slo_s = 2.65
    # 3 is clearly under the SLO, 6 clearly over it; 4 and 5 straddle it
    assert row.truth_range == (3, 5) and row.planned_in_range
    assert not within(row)  # the strict bar still says 5 is not the measured 4
    row.planned_agents = 6
    assert row.planned_in_range is False
    row.intervals.pop(6)
    assert row.truth_range == (3, None) and row.planned_in_range  # nothing clearly over


def test_the_table_shows_the_models_quantile_error_at_the_planned_n(tmp_path: Path) -> None:
    exact = TruthRow("round_robin", 2, "clean", 4, 4, 0.0, True, 2.4, 2.5, 2.65, {4: 2.5})
    above = TruthRow("cache_aware", 2, "clean", 4, 5, 25.0, False, 2.6, 2.86, 2.65, {5: 2.86})
    unmeasured = TruthRow("round_robin", 4, "clean", None, 9, None, None, 2.6, None, 2.65, {})
    assert quantile_error_pct(exact) == pytest.approx(-4.0)
    assert quantile_error_pct(above) == pytest.approx(-100 * 0.26 / 2.86)
    assert quantile_error_pct(unmeasured) is None
    text = truth_markdown(TruthConfig(out=tmp_path), [exact, above, unmeasured])
    assert "| 2.40 / 2.50 (-4.0%) |" in text and "| 2.60 / 2.86 (-9.1%) |" in text
    assert ("Within 5% of the truth (equal where it is under 20): 1 of 3; planned above it "
            "(the SLO at risk): 1; below it (GPUs to spare): 0.") in text
    assert "within 10% in 2 of 2, median absolute error 6.5%, largest 9.1%" in text


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_fleet_truth_finds_the_true_capacity_and_the_plan_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "truth"
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "fleet-truth", f"out={out}",
         "replicas=2", "policies=consistent_hash", "arms=clean",
         "levels=1,2,4", "min_continuations=8", "port=18700"],
        capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| consistent_hash | 2 | clean |" in done.stdout
    rows = json.loads((out / "fleet-truth.json").read_text())["rows"]
    assert len(rows) == 1
    row = rows[0]
    measured = {int(n): v for n, v in row["measured"].items()}
    true = row["true_agents"]
    # the truth is the boundary the measurements show: held at it, missed one above
    assert true is not None and true >= 1
    assert measured[true] is not None and measured[true] <= row["slo_s"]
    assert measured[true + 1] is None or measured[true + 1] > row["slo_s"]
    # the plan's row, coherent with what was measured: its error against the truth, and whether
    # the SLO held at the planned fleet. How close the plan comes is a measured figure, not an
    # assertion (docs/measured-figures.md "The fleet plan against a known truth": 9 of 18 rows
    # exact; this very row came within one agent in earlier CI runs, and on 2026-12-07 gave 2
    # planned against a true 4, the truth's N=4 measured at 2.63 s against an SLO of 2.63 s).
    planned = row["planned_agents"]
    assert planned is not None and planned >= 1
    assert row["error_pct"] == pytest.approx(100.0 * (planned - true) / true)
    if str(planned) in row["measured"]:
        assert row["held_at_planned"] == (measured[planned] is not None
                                          and measured[planned] <= row["slo_s"])
    # every measured level has its interval, and the range is read from them
    assert set(row["intervals"]) == set(row["measured"])
    low, high = row["truth_range"]
    assert high is None or low <= high
    assert (out / "runs" / "one-replica" / "sweep.jsonl").is_file()
    manifest = json.loads((out / "runs" / f"R2-consistent_hash-N{true}" /
                           "manifest.json").read_text())
    assert manifest["config"]["base_url"].startswith("http://127.0.0.1:")


@pytest.mark.e2e
def test_fleet_truth_refuses_a_bad_setting_in_one_line_from_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "fleet-truth", f"out={tmp_path}",
         "cache_discount=1.5"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cache_discount" in lines[0] and "1.5" in lines[0], done.stderr
    assert not (tmp_path / "runs").exists()
