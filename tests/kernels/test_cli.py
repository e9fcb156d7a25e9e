"""The command lines for real, in subprocesses: GPU-only entry points end with one line on a
machine without a GPU; `check` reads a results file back; bad input is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compaction_bench.kernels.costmodel import fit_phases
from compaction_bench.kernels.limits import measured_limits
from compaction_bench.kernels.resultfile import file_name, new_document, slug, write_results
from compaction_bench.kernels.shapes import shape_for_profile

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
NEEDS_NO_GPU = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="checks the message of a machine without a GPU")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compaction_bench", "kernels", *args], cwd=REPO,
                          env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
@NEEDS_NO_GPU
def test_device_check_says_it_needs_a_gpu_in_one_line() -> None:
    for done in (cli("device-check"),
                 subprocess.run([str(REPO / "kernels" / "device_check.sh")], cwd=REPO,
                                env={**ENV, "PY": sys.executable}, capture_output=True,
                                text=True, timeout=300)):
        assert done.returncode == 3, done.stderr
        lines = done.stderr.strip().splitlines()
        assert lines == ["error: needs a CUDA GPU; on this machine run `make kernels`"]


@pytest.mark.e2e
def test_check_prints_every_measured_level_with_its_heldout_error(tmp_path: Path) -> None:
    shape = shape_for_profile("cpu-tiny")
    limits = measured_limits("cpu", bandwidth_bytes_per_s=10e9, flops={"bf16": 400e9},
                             how="test")
    decode = [{"level": f"b={b},L={c}", "batch": b, "mean_context": c,
               "median_s": 0.04 + 0.002 * b + 1.5e-6 * b * c}
              for b in (1, 2, 3, 4) for c in (144, 1040, 3088)]
    document = new_document("calibration", {"type": "cpu", "name": "test cpu"}, ["test"])
    document["model"] = {"name": shape.name, "shape": shape.to_json()}
    document["limits"] = limits.to_json()
    document["fits"] = fit_phases({"decode": decode}, shape, limits)
    path = write_results(document, tmp_path / file_name("test cpu", shape.name, "vllm-0"))
    done = cli("check", str(path), "--device", "H200")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "decode: linear" in out and "held-out APE median" in out
    assert sum(1 for line in out.splitlines() if line.strip().startswith("b=")) == 12
    assert "on H200 ms" in out and "not validated" in out


@pytest.mark.e2e
def test_check_of_a_missing_file_is_one_line() -> None:
    done = cli("check", "/nonexistent/results.json")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: /nonexistent/results.json: no such results file (make kernels writes them "
        f"to {REPO / 'data' / 'kernels'})"]


@pytest.mark.e2e
def test_limits_lists_every_row_with_its_sources() -> None:
    done = cli("limits")
    assert done.returncode == 0
    assert [line.split(":")[0] for line in done.stdout.splitlines()
            if not line.startswith(" ")] == ["B300", "H200", "H100"]


def test_file_names_are_slugs() -> None:
    assert slug("Intel(R) Xeon(R) Processor") == "intel-xeon-processor"
    assert file_name("NVIDIA H200", "micro", "torch-2.9.0+cu128") == (
        "nvidia-h200__micro__torch-2.9.0-cu128.json")


@pytest.mark.e2e
def test_run_takes_words_make_variables_and_flags_as_one_set_of_settings() -> None:
    """`make kernels QUICK=1` is `kernels run quick=1` is `kernels run --quick` (issue 31); each
    bad setting is refused in one line before anything is measured, naming where it came from."""
    listed = cli("run", "--settings")
    assert listed.returncode == 0, listed.stderr
    assert {line.split()[0] for line in listed.stdout.splitlines()} == {
        "profile", "port", "base_url", "out_dir", "micro", "probe", "quick", "seed", "threads"}
    for args, env, needle in (
            (("threads=0",), {}, "threads: Input should be greater than or equal to 1 (got '0')"
                                 " (from command line)"),
            (("--from-env",), {"MAKEFLAGS": " -- SEED=-1", "SEED": "-1"},
             "seed: Input should be greater than or equal to 0 (got '-1') (from make SEED)"),
            (("--from-env",), {"COMPBENCH_PORT": "0"}, "(from environment COMPBENCH_PORT)"),
            (("seed=1", "--threads", "0"), {}, "threads: Input should be greater than or equal"),
            (("qiuck=1",), {}, "'qiuck=1': give settings as name=value with one of profile")):
        done = subprocess.run([sys.executable, "-m", "compaction_bench", "kernels", "run", *args],
                              cwd=REPO, env={**ENV, **env}, capture_output=True, text=True,
                              timeout=300, check=False)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1, (args, done.stderr)
        assert needle in lines[0], (args, lines[0])
