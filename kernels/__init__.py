"""Measured device costs for the capacity plan: what one uncached prefill token, one decode step
at a batch and context, and one byte moved cost on this device, measured, fitted and held
against the device's physical limits.

- `micro` (with `attention`, `triton_copy`, `stopwatch`, `measurement`): micro-benchmarks of
  bandwidth, matmuls at each model's shapes (`shapes`), attention and the paged KV gather, as
  fractions of the limits in `limits` (`limits.toml`; a CPU's are measured);
- `probe`: TTFT and inter-token probes against a live OpenAI-compatible vLLM;
- `fitting`, `costmodel`: step-time fits with k-fold held-out error, and the `CostModel` the
  plan loads (`costmodel.load(path)`); `resultfile`: the results files (SCHEMA.md);
- `entropy`, `fused_entropy`: per-token predictive entropy, fused in Triton on a GPU;
- `cli` (`make kernels`), `devicecheck` (`make kernels-gpu`, `device_check.sh`).

The modules a GPU-only machine needs (micro, attention, stopwatch, measurement, limits, shapes,
resultfile, entropy, fused_entropy, triton_copy, devicecheck) import nothing beyond the
standard library, PyTorch, Triton and nvidia-ml-py.
"""
