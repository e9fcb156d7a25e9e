"""Triton bandwidth kernels: a device copy and a streaming read, for the GPU micro-benchmarks.

Each program moves `BLOCK * ITERS` contiguous elements with 64-bit offsets (buffers of several
GiB overflow 32-bit element indices). The read kernel sums what it reads and writes one float
per program, so the compiler cannot drop the loads and the bytes written are negligible
(one per `BLOCK * ITERS` elements). They run on a CUDA device, or on the CPU under Triton's
interpreter (`TRITON_INTERPRET=1`, set before Triton is imported), which the tests use to check
their results where no GPU is present.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
ITERS = 8


@triton.jit  # type: ignore[untyped-decorator]
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):  # type: ignore[no-untyped-def]
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _read_kernel(src, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):  # type: ignore[no-untyped-def]
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out + tl.program_id(0), tl.sum(acc, axis=0))


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK * ITERS),)


def triton_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[:] = src for two contiguous tensors of the same size and dtype."""
    if src.numel() != dst.numel() or src.dtype != dst.dtype:
        raise ValueError("triton_copy needs tensors of the same size and dtype")
    _copy_kernel[_grid(src.numel())](src, dst, src.numel(), BLOCK=BLOCK, ITERS=ITERS)


def read_partials(src: torch.Tensor) -> torch.Tensor:
    """The buffer `triton_read` writes its per-program partial sums into."""
    return torch.empty(_grid(src.numel())[0], dtype=torch.float32, device=src.device)


def triton_read(src: torch.Tensor, partials: torch.Tensor) -> torch.Tensor:
    """Read every element of `src` once; `partials.sum()` is the sum of `src`."""
    _read_kernel[_grid(src.numel())](src, partials, src.numel(), BLOCK=BLOCK, ITERS=ITERS)
    return partials
