"""Per-token entropy: the PyTorch reference on distributions whose entropy is known, against
float64, in bounded memory; the fused Triton kernel against it (on a GPU, and on this CPU
through Triton's interpreter)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from compaction_bench.kernels.entropy import (
    ATOL,
    RTOL,
    entropy_reference,
    entropy_unfused,
    token_entropy,
)

REPO = Path(__file__).resolve().parents[2]
NO_GPU = "the fused Triton kernel needs a CUDA GPU (it is checked here through Triton's " \
         "interpreter instead)"


@pytest.mark.parametrize("vocab", [2, 49152, 262144])
def test_uniform_logits_have_entropy_log_v(vocab: int) -> None:
    logits = torch.full((3, vocab), 1.7, dtype=torch.bfloat16)
    assert entropy_reference(logits) == pytest.approx([math.log(vocab)] * 3, rel=1e-6)


def test_one_hot_has_entropy_zero() -> None:
    logits = torch.full((2, 1000), float("-inf"))
    logits[0, 7] = 3.0
    logits[1, 999] = -50.0
    assert entropy_reference(logits).tolist() == [0.0, 0.0]
    peaked = torch.zeros(1, 1000)
    peaked[0, 0] = 200.0  # the others have probability e^-200: entropy ~ 1e-84
    assert entropy_reference(peaked).item() == pytest.approx(0.0, abs=1e-30)


def test_two_point_distribution_and_masked_tokens() -> None:
    # p = (1/4, 3/4) on two tokens, the rest masked with -inf: H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    logits = torch.full((1, 50), float("-inf"), dtype=torch.float64)
    logits[0, 3], logits[0, 9] = 0.0, math.log(3.0)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_reference(logits).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_agrees_with_float64_on_random_logits(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 30000, generator=generator) * 5).to(dtype)
    exact = entropy_reference(logits.double())
    got = entropy_reference(logits)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, atol=ATOL, rtol=RTOL)
    assert torch.allclose(entropy_unfused(logits).double(), exact, atol=ATOL, rtol=RTOL)
    assert torch.allclose(token_entropy(logits).double(), exact, atol=ATOL, rtol=RTOL)


def test_chunking_changes_nothing_and_keeps_leading_dimensions() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, 4000, generator=generator)
    whole = entropy_reference(logits, chunk_bytes=1 << 30)
    one_row = entropy_reference(logits, chunk_bytes=1)  # one row per chunk
    assert whole.shape == (2, 3, 5) and torch.equal(whole, one_row)


@pytest.mark.e2e
def test_large_vocabulary_never_holds_a_float32_copy_of_the_whole_input() -> None:
    """512 positions over a 262,144-token vocabulary: 256 MiB of bf16 logits, 512 MiB as
    float32. While the reference runs, the process's peak resident memory may grow by two
    64 MiB float32 chunks and change, never by a float32 copy of the whole (the unfused
    version would add 1.5 GiB)."""
    script = textwrap.dedent("""
        import resource, torch
        from compaction_bench.kernels.entropy import entropy_reference
        logits = torch.empty(512, 262144, dtype=torch.bfloat16).normal_()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        h = entropy_reference(logits)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grown * 1024, float(h.mean()))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
                          check=True)
    grown, mean = (float(v) for v in done.stdout.split())
    assert grown < 300 * 2**20, f"peak memory grew by {grown / 2**20:.0f} MiB"
    assert 10.0 < mean < math.log(262144)


@pytest.mark.e2e
def test_fused_kernel_under_the_triton_interpreter() -> None:
    """The Triton kernel's arithmetic, run by Triton's interpreter on this CPU (no GPU
    needed): masked tokens, uniform rows, bf16 input, strided rows, several blocks per row."""
    script = textwrap.dedent("""
        import math, torch
        from compaction_bench.kernels.entropy import ATOL, RTOL, entropy_reference
        from compaction_bench.kernels.fused_entropy import fused_entropy
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 5000, generator=g) * 4
        x[0, :100] = float("-inf")
        assert torch.allclose(fused_entropy(x, block=1024).double(),
                              entropy_reference(x.double()), atol=ATOL, rtol=RTOL)
        u = fused_entropy(torch.zeros(2, 300), block=128)
        assert abs(u[0].item() - math.log(300)) < 1e-5, u
        one = torch.full((1, 300), float("-inf")); one[0, 5] = 3.0
        assert fused_entropy(one, block=128).item() == 0.0
        b = torch.randn(3, 777, generator=g).bfloat16()
        assert torch.allclose(fused_entropy(b, block=256).double(),
                              entropy_reference(b.double()), atol=ATOL, rtol=RTOL)
        wide = torch.randn(6, 1000, generator=g)
        assert torch.allclose(fused_entropy(wide[::2], block=256).double(),
                              entropy_reference(wide[::2].double()), atol=ATOL, rtol=RTOL)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize(("rows", "vocab", "dtype"), [
    (257, 49152, torch.bfloat16), (64, 151936, torch.float16), (33, 262144, torch.float32)])
def test_fused_kernel_agrees_with_the_reference_on_gpu(rows: int, vocab: int,
                                                       dtype: torch.dtype) -> None:
    from compaction_bench.kernels.fused_entropy import fused_entropy

    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=generator, device="cuda") * 4).to(dtype)
    logits[0, : vocab // 2] = float("-inf")
    exact = entropy_reference(logits.double())
    assert torch.allclose(fused_entropy(logits).double(), exact, atol=ATOL, rtol=RTOL)
    assert torch.allclose(token_entropy(logits).double(), exact, atol=ATOL, rtol=RTOL)
    strided = logits[::2]
    assert torch.allclose(fused_entropy(strided).double(), exact[::2], atol=ATOL, rtol=RTOL)
