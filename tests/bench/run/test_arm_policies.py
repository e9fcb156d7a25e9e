"""Every arm name the bench accepts becomes an arm whose first postfork request passes the
reasoning-only invariant on the wire; an unknown name stops `make bench` in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from compaction_bench.bench.run.arm import ArmError, AttemptContext, arm_for, check_on_the_wire
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.errors import ExitCode
from compaction_bench.common.paths import histories_root, repo_root
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.compaction.compactor import self_compressor
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.history import load_history
from compaction_bench.histories.policies.armfile import write_arm_files
from compaction_bench.histories.policies.scorer import ScorerConfig
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.serve.profile import load_profile

POLICIES = ["entropy", "step-entropy", "delete-all-thinking", "keep-latest", "random-30"]
URL = "http://127.0.0.1:9/v1"  # nothing is sent: the first requests are only built


@pytest.mark.e2e  # the converted proxy model (`proxy_model`)
@pytest.mark.usefixtures("proxy_model")
def test_every_policy_arm_passes_the_invariant_on_the_wire(tmp_path: Path) -> None:
    shutil.copy(histories_root() / "fix-median" / "clean.json", tmp_path / "clean.json")
    # self-every-3 is identity-short on cpu-tiny: its compressor gets no request
    written = write_arm_files(tmp_path / "clean.json", [*POLICIES, "self-every-3"],
                              compressors={"self": self_compressor(URL)},
                              scorer=ScorerConfig(model="embedded:smollm2-135m-instruct"))
    assert len(written) == 6 and all(r.written for r in written)
    task = load_task("fix-median")
    config = config_for_profile(load_profile("cpu-tiny"), URL, seed=5)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    context = AttemptContext(regime="dedicated", block=1, attempt="original", seed=5,
                             ledger=ledger)
    clean = arm_for("clean", load_history(tmp_path / "clean.json"), compressors={})
    for name in [*POLICIES, "self-every-3", "placebo"]:
        path = tmp_path / f"{'clean' if name == 'placebo' else name}.json"
        arm = arm_for(name, load_history(path), compressors={"self": self_compressor(URL)})
        wire = check_on_the_wire(arm, config, clean, config, task, context)
        assert wire.error is None and wire.report["passed"], (name, wire.error)
        if name in ("delete-all-thinking", "keep-latest", "random-30"):
            assert wire.report["reasoning_fields"], name  # their prefixes differ from clean's
    keep = arm_for("keep-latest", load_history(tmp_path / "keep-latest.json"), compressors={})
    assert keep.fork_rewrite["fork_rewrite_requests"] == 0  # deletion needs no scorer
    assert ledger.entries == []  # the first request decides nothing new: the file settled it


def test_a_policy_arm_must_continue_its_own_file(tmp_path: Path) -> None:
    clean = load_history(histories_root() / "fix-median" / "clean.json")
    with pytest.raises(ArmError, match="the file is arm 'clean', not 'entropy'"):
        arm_for("entropy", clean, compressors={})
    with pytest.raises(ArmError, match="no compressor 'external' configured"):
        arm_for("external-every-2", clean, compressors={})


@pytest.mark.e2e
def test_an_unknown_arm_name_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValidationError, match="unknown arm 'entropi'; known arms: clean"):
        BenchConfig(arms=("clean", "entropi"))
    assert BenchConfig(arms=("clean", "random-10", "self-every-4")).arms[1] == "random-10"
    done = subprocess.run([sys.executable, "-m", "compaction_bench", "bench", "source=agent",
                           "arms=clean,entropi",
                           f"base_url={URL}"], cwd=repo_root(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == ExitCode.USAGE
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: invalid bench settings: arms: ") and "random-<r>" in line
