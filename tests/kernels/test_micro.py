"""The micro-benchmarks for real on this CPU, at toy sizes: warm-up excluded, every sample
kept, work counted as the formulas say, limits measured, fractions bounded, JSON written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from compaction_bench.common.files import write_json_atomic
from compaction_bench.kernels.micro import MicroConfig, run_micro
from compaction_bench.kernels.shapes import shape_for_profile
from compaction_bench.kernels.stopwatch import Stopwatch, quantile

REPO = Path(__file__).resolve().parents[2]


def test_stopwatch_excludes_warmup_and_keeps_every_sample() -> None:
    calls = []
    watch = Stopwatch(torch.device("cpu"), warmup=3, reps=4, target_sample_s=0.0)
    timing = watch.time(lambda: calls.append(1))
    assert timing.inner == 1 and len(timing.samples_s) == 4
    assert len(calls) == 3 + 1 + 4  # warm-up, one calibration call, the timed samples
    assert timing.p10_s <= timing.median_s <= timing.p90_s
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_tiny_cpu_suite_runs_and_holds_itself_against_its_own_peaks(tmp_path: Path) -> None:
    shape = shape_for_profile("cpu-tiny")
    config = MicroConfig.cpu(shape, bandwidth_bytes=16 << 20, token_counts=(1, 16),
                             peak_matmul={"bf16": 256}, prefill=((16, 32),),
                             decode=((2, 64),), kv_block_sizes=(16,), kv_gather_bytes=1 << 20,
                             warmup=1, reps=3)
    limits, found = run_micro(config, device_name="test-cpu")
    assert limits is not None and limits.measured and "measured on this host" in limits.sources[0]
    benches = {m.bench for m in found}
    assert benches == {"bandwidth", "peak_matmul", "matmul", "attention_prefill",
                       "attention_decode", "kv_gather"}
    for m in found:
        assert m.status == "ok" and m.timing is not None and len(m.timing.samples_s) == 3
        assert m.fraction_of_roofline is not None
    # a median is never better than the best sample the limit was taken from
    for m in found:
        if m.bench in ("bandwidth", "kv_gather"):
            assert m.fraction_bytes is not None and m.fraction_bytes <= 1.0 + 1e-9
    qkv = next(m for m in found if m.name == "qkv_proj" and m.params["T"] == 16)
    assert qkv.flops == 2 * 16 * 576 * 960
    assert qkv.bytes == 2 * (16 * 576 + 576 * 960 + 16 * 960)
    copy = next(m for m in found if m.name == "copy")
    assert copy.bytes == 2 * (16 << 20)  # read + written
    write_json_atomic(tmp_path / "m.json", [m.to_json() for m in found])
    assert len(json.loads((tmp_path / "m.json").read_text())) == len(found)


def test_fp8_on_a_cpu_is_recorded_as_unsupported_not_skipped() -> None:
    config = MicroConfig.cpu(shape_for_profile("cpu-tiny"), bandwidth_bytes=4 << 20,
                             token_counts=(16,), dtypes=("bf16", "fp8"),
                             peak_matmul={"bf16": 128}, prefill=(), decode=(),
                             kv_block_sizes=(), warmup=1, reps=2)
    _, found = run_micro(config, device_name="test-cpu")
    fp8 = [m for m in found if m.dtype == "fp8"]
    assert fp8 and all(m.status == "unsupported" and "CUDA" in (m.reason or "") for m in fp8)


@pytest.mark.e2e
def test_triton_bandwidth_kernels_under_the_interpreter() -> None:
    script = textwrap.dedent("""
        import torch
        from compaction_bench.kernels.triton_copy import (
            BLOCK,
            ITERS,
            read_partials,
            triton_copy,
            triton_read,
        )
        n = BLOCK * ITERS * 2 + 123  # more than one program, and a ragged tail
        src = torch.rand(n)
        dst = torch.empty_like(src)
        triton_copy(src, dst)
        assert torch.equal(src, dst)
        total = triton_read(src, read_partials(src)).sum()
        assert torch.allclose(total, src.sum(), rtol=1e-5), (total, src.sum())
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA events, fp8 matmuls and Triton kernels need a CUDA GPU")
def test_gpu_suite_at_toy_sizes() -> None:
    shape = shape_for_profile("cpu-tiny")
    config = MicroConfig.gpu((shape,), bandwidth_bytes=64 << 20, token_counts=(16,),
                             peak_matmul={"bf16": 1024, "fp8": 1024}, prefill=((128, 256),),
                             decode=((2, 256),), kv_block_sizes=(16,),
                             kv_gather_bytes=8 << 20, warmup=1, reps=3)
    _, found = run_micro(config, device_name=torch.cuda.get_device_name(0))
    assert {m.impl for m in found if m.bench == "bandwidth"} == {"torch", "triton"}
    assert all(m.timing is not None and m.timing.timer == "cuda-events" for m in found
               if m.status == "ok")
