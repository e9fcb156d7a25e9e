"""Which model answered (issue 32): every request record carries the model its response names,
and a response naming a model the run's server does not serve fails its arm, and the serve
self-check, in one line naming both (a hosted name that now serves another model, BASE_URL at
the wrong server). The fake engine answers as another model on request (`answer_as`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compaction_bench.bench.run.block import wrong_model
from compaction_bench.common.paths import repo_root
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.selfcheck import SelfCheckError, run_selfcheck
from compaction_bench.transport.request import RequestRecord

RECORD = "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000"


def test_a_response_naming_another_model_is_one_line_naming_both() -> None:
    served = ("target", "compressor")
    asked = [RequestRecord(request_id="a", sent_s=0, model="target", served_model="target"),
             RequestRecord(request_id="b", sent_s=1, model="compressor", served_model="target")]
    assert wrong_model(asked, served) is None  # vLLM answers with its first served name
    assert wrong_model([RequestRecord(request_id="c", sent_s=0, served_model="x")], ()) is None
    moved = [*asked, RequestRecord(request_id="d", sent_s=2, model="target",
                                   served_model="deepseek-v4.1-flash")]
    line = wrong_model(moved, served)
    assert line is not None and "\n" not in line
    assert "'deepseek-v4.1-flash'" in line and "'target', 'compressor'" in line


def bench(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=replay", "profile=cpu-tiny",
         f"base_url={url}", "selfcheck=0", f"records={RECORD}", "blocks=1", *args],
        cwd=repo_root(), capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.e2e
def test_a_run_answered_by_another_model_fails_every_arm_and_says_which(
        tmp_path: Path) -> None:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5)) as honest:
        done = bench(tmp_path, honest.api_url, "run_id=honest")
    assert done.returncode == 0, done.stderr[-2000:]
    requests = [r for r in lines(tmp_path / "honest" / "requests.jsonl")
                if r["source"] in ("clean", "external")]
    assert requests and {r["served_model"] for r in requests} == {"target"}

    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5, answer_as="deepseek-v4.1-flash")) as fake:
        bench(tmp_path, fake.api_url, "run_id=moved")
        with pytest.raises(SelfCheckError) as err:
            run_selfcheck(fake.api_url, load_profile("cpu-tiny"))
    arms = lines(tmp_path / "moved" / "arms.jsonl")
    assert arms and all(a["status"] == "failed" for a in arms)
    for arm in arms:
        error = str(arm["error"])
        assert error.startswith("WrongModelError: a response names the model "
                                "'deepseek-v4.1-flash'") and "'target'" in error, error
    names = next(c for c in err.value.report.checks if c.name == "served names")
    assert names.status == "fail"
    assert "another model answered: target answered as 'deepseek-v4.1-flash'" in names.detail
