"""The fused Triton entropy kernel: per-row predictive entropy of logits in one pass.

One program per row streams the row through registers in blocks of `BLOCK` logits and keeps
three running numbers (an online softmax): the maximum m seen so far, s = sum exp(x - m) and
t = sum exp(x - m) * (x - m). When a block raises the maximum to m', both sums are rescaled by
a = exp(m - m'): s' = a*s and t' = a*(t + (m - m')*s). At the end H = log(s) - t / s. Nothing
but the row's entropy is ever written: no softmax, no log-softmax, no float32 copy of the input.
Logits of -inf (masked tokens) contribute nothing; a row of all -inf gives NaN.

Accumulation is float32 whatever the input dtype. Runs on CUDA, or on the CPU under Triton's
interpreter (`TRITON_INTERPRET=1` set before Triton is imported), which the tests use to check
it against the PyTorch reference where no GPU is present.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def _entropy_kernel(x_ptr, out_ptr, stride_row, V, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_row
    offs = tl.arange(0, BLOCK)
    neg_inf = float("-inf")
    m = tl.max(tl.full([BLOCK], neg_inf, tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    t = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, V, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < V, other=neg_inf).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, axis=0))
        safe_m = tl.where(new_m == neg_inf, 0.0, new_m)
        alpha = tl.exp(m - safe_m)  # 0 while nothing finite was seen (m = -inf)
        shift = tl.where(m == neg_inf, 0.0, m - safe_m)
        e = tl.exp(x - safe_m)  # 0 for masked lanes and -inf logits
        centred = tl.where(x == neg_inf, 0.0, x - safe_m)
        t = alpha * (t + shift * s) + tl.sum(e * centred, axis=0)
        s = alpha * s + tl.sum(e, axis=0)
        m = new_m
    tl.store(out_ptr + row, tl.log(s) - t / s)


def fused_entropy(logits: torch.Tensor, *, block: int | None = None) -> torch.Tensor:
    """Entropy in nats of each row of a 2-D logits tensor (float32 result, one per row).

    The last dimension must be contiguous; rows may be strided (a slice of a larger batch)."""
    if logits.dim() != 2:
        raise ValueError(f"fused_entropy takes [rows, vocab] logits, got shape "
                         f"{tuple(logits.shape)}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return out
    size = block or min(triton.next_power_of_2(vocab), 8192)
    _entropy_kernel[(rows,)](logits, out, logits.stride(0), vocab, BLOCK=size,
                             num_warps=8 if size >= 4096 else 4)
    return out
