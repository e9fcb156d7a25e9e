"""The sweep's bookkeeping: its levels, and which cells a resumed sweep still runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from compaction_bench.bench.run.config import (
    BenchConfig,
    BenchError,
    SweepSettings,
    continuation_block,
)
from compaction_bench.bench.run.sources import with_source_defaults
from compaction_bench.bench.run.sweep import SWEEP_FILE, finished_cells
from compaction_bench.bench.runfolder import ArmRecord, write_records
from compaction_bench.common.files import JsonlWriter
from compaction_bench.serve.profile import load_profile


def test_default_levels_double_up_to_twice_the_sequence_limit() -> None:
    assert SweepSettings().levels_for(4) == (1, 2, 4, 8)
    assert SweepSettings().levels_for(32) == (1, 2, 4, 8, 16, 32, 64)
    assert SweepSettings().levels_for(48) == (1, 2, 4, 8, 16, 32, 48, 64, 96)
    assert SweepSettings(levels=(4, 1, 4)).levels_for(32) == (1, 4)
    with pytest.raises(ValidationError, match="positive fleet sizes"):
        SweepSettings(levels=(0, 2))
    config = BenchConfig(regime="sweep", sweep={"levels": [1, 2], "min_continuations": 3})
    assert config.sweep.levels == (1, 2) and config.sweep.min_continuations == 3


def test_continuations_per_level_default_to_what_lolo_needs_on_gpu_and_8_on_cpu() -> None:
    sweep = BenchConfig(regime="sweep")
    with pytest.raises(BenchError, match="SWEEP_MIN_CONTINUATIONS"):
        _ = sweep.sweep.continuations  # unresolved: never a silent fallback
    gpu = load_profile("b300-deepseek-v4-flash-nvfp4")
    assert with_source_defaults(sweep, gpu).sweep.continuations == 32
    assert with_source_defaults(sweep, load_profile("cpu-tiny")).sweep.continuations == 8
    assert with_source_defaults(sweep, load_profile("fake-fleet")).sweep.continuations == 8
    given = BenchConfig(regime="sweep", sweep={"min_continuations": 5})
    assert with_source_defaults(given, gpu).sweep.continuations == 5


def test_resume_skips_finished_cells_and_reruns_a_cut_one_as_its_next_pass(tmp_path: Path
                                                                        ) -> None:
    with JsonlWriter(tmp_path / SWEEP_FILE) as cells:
        cells.write({"arm": "clean", "level": 1, "status": "done", "cell_pass": 1})
    write_records(tmp_path / "arms.jsonl", [
        ArmRecord("sweep", continuation_block(1, 0, 0), "clean", "original", "complete", 3.0,
                  level=1, sweep_agent=0, sweep_index=0, sweep_phase="warmup"),
        ArmRecord("sweep", continuation_block(2, 1, 0), "self", "original", "complete", 3.0,
                  level=2, sweep_agent=1, sweep_index=0, sweep_phase="warmup")])
    done, passes = finished_cells(tmp_path)
    assert done == {("clean", 1)} and passes == {("self", 2): 2}


def test_a_quiet_only_resume_measures_contended_cells_again_and_the_plan_reads_the_new_pass(
        tmp_path: Path) -> None:
    contended = {"verdict": "contended", "figure": "other processes used 0.43 of 2 cores"}
    with JsonlWriter(tmp_path / SWEEP_FILE) as cells:
        cells.write({"arm": "clean", "level": 1, "status": "done", "cell_pass": 1,
                     "host": {"verdict": "quiet"}})
        cells.write({"arm": "clean", "level": 2, "status": "done", "cell_pass": 1,
                     "host": contended})
        cells.write({"arm": "self", "level": 2, "status": "done", "cell_pass": 1,
                     "host": contended})
        cells.write({"arm": "self", "level": 2, "status": "done", "cell_pass": 2,
                     "host": {"verdict": "quiet"}})  # measured again already: done
    write_records(tmp_path / "arms.jsonl", [
        ArmRecord("sweep", continuation_block(2, 0, 0), "clean", "original", "complete", 3.0,
                  level=2, sweep_agent=0, sweep_index=0, sweep_phase="measured")])
    done, passes = finished_cells(tmp_path)  # a plain RESUME keeps every finished cell
    assert done == {("clean", 1), ("clean", 2), ("self", 2)} and passes == {}
    done, passes = finished_cells(tmp_path, remeasure_contended=True)
    assert done == {("clean", 1), ("self", 2)} and passes == {("clean", 2): 2}
