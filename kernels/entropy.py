"""Per-token predictive entropy over the full vocabulary, for entropy-guided history pruning.

`token_entropy(logits)` takes logits of shape [..., vocab] from a proxy model and returns the
entropy H = -sum_v p_v log p_v (nats, float32) of each position, shape [...]. On a CUDA tensor
it runs the fused Triton kernel (kernels/fused_entropy.py: the softmax is never written to
memory); elsewhere the PyTorch reference below. Both compute in float32 (float64 input: the
reference stays in float64) and agree to the tolerance `ATOL` / `RTOL` state.

The reference works through the rows in chunks of at most `chunk_bytes` of float32, so a batch
of 8,192 positions over a 262,144-token vocabulary (8 GiB in float32) never exists as a float32
copy: per chunk it holds the shifted logits and their exponentials (two float32 chunks), and
computes H = log(s) - sum(e * (x - m)) / s with m the row maximum, e = exp(x - m), s = sum e,
which never forms log-probabilities. Logits of -inf contribute nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from compaction_bench.kernels.measurement import Measurement
from compaction_bench.kernels.stopwatch import Stopwatch

# Any of the float32 versions vs the float64 computation: |difference| <= ATOL + RTOL * |H| per
# position (torch.allclose). float32 rounding of sums over up to 262,144 terms stays well
# inside it (tests/kernels/test_entropy.py checks it on random logits).
ATOL = 1e-4
RTOL = 1e-4
DEFAULT_CHUNK_BYTES = 64 << 20


def entropy_reference(logits: torch.Tensor, *,
                      chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> torch.Tensor:
    """The PyTorch reference (see the module docstring); any device, any float dtype."""
    if logits.dim() == 0:
        raise ValueError("logits need a vocabulary dimension")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    out = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
    rows = max(1, chunk_bytes // max(1, vocab * torch.finfo(dtype).bits // 8))
    lowest = torch.finfo(dtype).min
    for start in range(0, flat.shape[0], rows):
        x = flat[start:start + rows].to(dtype, copy=True)  # chunk copy 1
        x.sub_(x.amax(dim=-1, keepdim=True))
        x.clamp_(min=lowest)  # -inf -> lowest: exp gives 0 and 0 * lowest is 0, not NaN
        e = torch.exp(x)  # chunk copy 2
        s = e.sum(dim=-1)
        t = e.mul_(x).sum(dim=-1)
        out[start:start + rows] = torch.log(s) - t / s
    result = out.reshape(logits.shape[:-1])
    return result if dtype == torch.float64 else result.float()


def triton_ready(device: torch.device) -> bool:
    """Whether the fused kernel can run on `device` (CUDA with Triton importable)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats, float32) of each position of [..., vocab] logits; fused on CUDA."""
    if triton_ready(logits.device) and logits.dtype in (torch.float16, torch.bfloat16,
                                                         torch.float32):
        from compaction_bench.kernels.fused_entropy import fused_entropy

        vocab = logits.shape[-1]
        return fused_entropy(logits.reshape(-1, vocab)).reshape(logits.shape[:-1])
    return entropy_reference(logits).float()


def entropy_unfused(logits: torch.Tensor) -> torch.Tensor:
    """The textbook version the fused kernel is benchmarked against: it writes the float32
    softmax and log-softmax of the whole input to memory."""
    x = logits.float()
    return -(torch.softmax(x, dim=-1) * torch.log_softmax(x, dim=-1)).sum(dim=-1)


def _entropy_row(watch: Stopwatch, rows: int, vocab: int, dtype: torch.dtype,
                 generator: torch.Generator) -> dict[str, Any]:
    logits = (torch.randn(rows, vocab, generator=generator, device=watch.device) * 4).to(dtype)
    exact = entropy_reference(logits.double(), chunk_bytes=256 << 20)
    moved = float(logits.numel() * logits.element_size())
    runs: dict[str, Callable[[], torch.Tensor]] = {}
    if triton_ready(watch.device):
        from compaction_bench.kernels.fused_entropy import fused_entropy

        runs["fused-triton"] = lambda: fused_entropy(logits)
    runs["unfused"] = lambda: entropy_unfused(logits)
    runs["reference"] = lambda: entropy_reference(logits)
    name_of_dtype = str(dtype).split(".")[-1]
    row: dict[str, Any] = {"rows": rows, "vocab": vocab, "dtype": name_of_dtype,
                           "logits_bytes": moved, "runs": {}}
    for name, fn in runs.items():
        error = float((fn().double() - exact).abs().max())
        m = Measurement("entropy", name, "triton" if "triton" in name else "torch",
                        name_of_dtype, {"rows": rows, "vocab": vocab}, 0.0, moved,
                        watch.time(fn))
        row["runs"][name] = {**m.to_json(), "max_abs_error_vs_float64": error}
    if "fused-triton" in row["runs"]:
        row["speedup_vs_unfused"] = (row["runs"]["unfused"]["timing"]["median_s"]
                                     / row["runs"]["fused-triton"]["timing"]["median_s"])
    return row


def benchmark_entropy(watch: Stopwatch, shapes: list[tuple[int, int]],
                      dtype: torch.dtype = torch.bfloat16,
                      seed: int = 0) -> list[dict[str, Any]]:
    """Fused (on GPU), unfused and reference entropy at [rows, vocab] `shapes`: time, logits
    bytes read per second, and the largest disagreement with the float64 computation."""
    generator = torch.Generator(device=watch.device)
    generator.manual_seed(seed)
    return [_entropy_row(watch, rows, vocab, dtype, generator) for rows, vocab in shapes]
