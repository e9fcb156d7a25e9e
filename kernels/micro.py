"""The micro-benchmark suite: memory bandwidth, matrix products at each model's shapes,
attention prefill/decode and the paged KV gather, each held against the device's limits.

- bandwidth: a device copy (bytes read + written) and a streaming read (a sum), in PyTorch
  everywhere and in Triton on a GPU, on buffers far larger than the last-level cache;
- peak_matmul: a large square matrix product per dtype, the best the device shows;
- matmul: x[T, k] @ W[k, n] for every weight shape of the chosen models (kernels/shapes.py) at
  token counts 1 ... 8,192, bf16 everywhere and fp8 (e4m3, `torch._scaled_mm`) on GPUs that
  have it. For expert matrices T is the number of tokens routed to one expert;
- attention and kv_gather: kernels/attention.py.

Limits: a GPU is held against its row of kernels/limits.toml (datasheet figures); a CPU
against its own measured peaks from this very run: the best single sample of the runs over
buffers larger than its last-level cache (copy, read, KV gather) and of any matmul per dtype
(kernels/limits.py `measured_limits`). Operations whose data stays in cache (a small decode
attention) can then show more than 100% of the bandwidth figure: that says where they ran.

`MicroConfig` is a frozen dataclass, not a pydantic model: the GPU device check runs this
module with PyTorch alone. Inputs are random normal values (never all-zero).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from compaction_bench.kernels import attention
from compaction_bench.kernels.limits import DeviceLimits, limits_for, measured_limits
from compaction_bench.kernels.measurement import Measurement
from compaction_bench.kernels.shapes import ModelShape, gemms
from compaction_bench.kernels.stopwatch import Stopwatch

Echo = Callable[[Measurement], None]


@dataclass(frozen=True)
class MicroConfig:
    """What the suite measures on one device; `cpu()` and `gpu()` give the shipped sizes."""

    device: str
    shapes: tuple[ModelShape, ...]
    bandwidth_bytes: int
    token_counts: tuple[int, ...] = (1, 16, 128, 1024, 8192)
    dtypes: tuple[str, ...] = ("bf16",)
    peak_matmul: dict[str, int] = field(default_factory=lambda: {"bf16": 2048})
    prefill: tuple[tuple[int, int], ...] = ()  # (chunk, cached)
    decode: tuple[tuple[int, int], ...] = ()  # (batch, context)
    kv_block_sizes: tuple[int, ...] = (16, 128, 256)
    kv_gather_bytes: int = 64 << 20
    attention_shapes: int = 1  # how many of `shapes` (first ones) get attention benchmarks
    # CPU threads for PyTorch (None: leave PyTorch's default). On a small shared host one
    # thread is the default: an OpenMP region over both of 2 busy cores waits for whichever
    # thread the scheduler parked (measured here: 8 ms for a 1-token matmul with 2 threads,
    # 0.16 ms with 1), so multi-thread figures there time the scheduler, not the kernel.
    threads: int | None = None
    warmup: int = 2
    reps: int = 5
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["shapes"] = [shape.name for shape in self.shapes]
        return data

    @classmethod
    def cpu(cls, shape: ModelShape, **overrides: Any) -> MicroConfig:
        """Sizes for `make kernels` on a small shared CPU: about a minute on 2 cores."""
        base = cls(device="cpu", shapes=(shape,), bandwidth_bytes=512 << 20,
                   peak_matmul={"bf16": 2048, "fp32": 1024},
                   prefill=((128, 0), (512, 0), (2048, 0), (128, 2048), (512, 2048),
                            (2048, 2048)),
                   decode=((1, 1024), (1, 4096), (4, 1024), (4, 4096)),
                   kv_gather_bytes=256 << 20, warmup=2, reps=5, threads=1)
        return dataclasses.replace(base, **overrides)

    @classmethod
    def gpu(cls, shapes: tuple[ModelShape, ...], **overrides: Any) -> MicroConfig:
        """Sizes for the device check: every model's shapes, bf16 and fp8, minutes on an H200."""
        base = cls(device="cuda", shapes=shapes, bandwidth_bytes=2 << 30,
                   dtypes=("bf16", "fp8"), peak_matmul={"bf16": 8192, "fp8": 8192},
                   prefill=tuple((c, p) for c in (512, 2048, 8192) for p in (0, 8192, 32768)),
                   decode=tuple((b, ctx) for b in (1, 8, 32, 128) for ctx in (1024, 8192, 32768)
                                if b * ctx <= 128 * 8192),
                   kv_gather_bytes=1 << 30, attention_shapes=len(shapes), warmup=3, reps=20)
        return dataclasses.replace(base, **overrides)


def _fill(numel: int, dtype: torch.dtype, device: torch.device,
          generator: torch.Generator) -> torch.Tensor:
    return torch.rand(numel, generator=generator, device=device, dtype=torch.float32).to(dtype)


def bandwidth(config: MicroConfig, watch: Stopwatch, generator: torch.Generator,
              echo: Echo) -> list[Measurement]:
    """Copy and streaming read of `bandwidth_bytes` float32 buffers (torch; Triton on GPU)."""
    device = watch.device
    numel = config.bandwidth_bytes // 4
    src = _fill(numel, torch.float32, device, generator)
    dst = torch.empty_like(src)
    dst.fill_(1.0)  # touch every page before timing (first-touch faults are not bandwidth)
    size = float(numel * 4)
    params = {"MiB": config.bandwidth_bytes >> 20}
    runs: list[tuple[str, str, Callable[[], object], float]] = [
        ("copy", "torch", lambda: dst.copy_(src), 2 * size),
        ("read", "torch", lambda: src.sum(), size)]
    if device.type == "cuda":
        from compaction_bench.kernels.triton_copy import read_partials, triton_copy, triton_read

        partials = read_partials(src)
        runs += [("copy", "triton", lambda: triton_copy(src, dst), 2 * size),
                 ("read", "triton", lambda: triton_read(src, partials), size)]
    out = []
    for name, impl, fn, moved in runs:
        m = Measurement("bandwidth", name, impl, "fp32", params, 0.0, moved, watch.time(fn))
        echo(m)
        out.append(m)
    return out


def _matmul_call(dtype: str, rows: int, k: int, n: int, device: torch.device,
                 generator: torch.Generator) -> tuple[Callable[[], object], int]:
    """A closure computing x[rows, k] @ W[k, n], and the rows it really uses (fp8 pads to 16)."""
    if dtype == "fp8":
        if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
            raise NotImplementedError("fp8 matmul needs a CUDA GPU with fp8 tensor cores "
                                      "(torch._scaled_mm)")
        padded = max(16, (rows + 15) // 16 * 16)  # _scaled_mm wants multiples of 16
        x = torch.randn(padded, k, generator=generator, device=device).to(torch.float8_e4m3fn)
        # column-major W, as _scaled_mm requires for its second operand
        w = torch.randn(n, k, generator=generator, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)

        def fp8() -> object:
            return torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        return fp8, padded
    dt = attention.DTYPES[dtype]
    x = torch.randn(rows, k, generator=generator, device=device).to(dt)
    w = torch.randn(k, n, generator=generator, device=device).to(dt)
    return (lambda: torch.matmul(x, w)), rows


def _matmul(bench: str, name: str, dtype: str, rows: int, k: int, n: int, watch: Stopwatch,
            generator: torch.Generator, params: dict[str, Any]) -> Measurement:
    try:
        call, used = _matmul_call(dtype, rows, k, n, watch.device, generator)
        timing = watch.time(call)
    except (NotImplementedError, RuntimeError, TypeError) as exc:
        return Measurement(bench, name, "torch", dtype, params, 2.0 * rows * k * n, 0.0,
                           status="unsupported", reason=str(exc).splitlines()[0][:200])
    size = 1 if dtype == "fp8" else torch.tensor([], dtype=attention.DTYPES[dtype]).element_size()
    out_size = 2 if dtype == "fp8" else size
    moved = float(size * (used * k + k * n) + out_size * used * n)
    notes = {"rows_padded_to": used} if used != rows else {}
    return Measurement(bench, name, "torch", dtype, params, 2.0 * used * k * n, moved, timing,
                       notes=notes)


def peak_matmuls(config: MicroConfig, watch: Stopwatch,
                 generator: torch.Generator) -> list[Measurement]:
    return [_matmul("peak_matmul", "square", dtype, n, n, n, watch, generator, {"n": n})
            for dtype, n in config.peak_matmul.items()]


def matmuls(config: MicroConfig, watch: Stopwatch, generator: torch.Generator,
            echo: Echo) -> list[Measurement]:
    out = []
    seen: set[tuple[int, int]] = set()
    for shape in config.shapes:
        for gemm in gemms(shape):
            if (gemm.k, gemm.n) in seen:  # same shape in two models: measured once
                continue
            seen.add((gemm.k, gemm.n))
            for tokens in config.token_counts:
                if gemm.max_tokens is not None and tokens > gemm.max_tokens:
                    continue
                for dtype in config.dtypes:
                    params = {"model": shape.name, "T": tokens, "k": gemm.k, "n": gemm.n}
                    m = _matmul("matmul", gemm.name, dtype, tokens, gemm.k, gemm.n, watch,
                                generator, params)
                    echo(m)
                    out.append(m)
    return out


def attention_runs(config: MicroConfig, watch: Stopwatch, generator: torch.Generator,
                   echo: Echo) -> list[Measurement]:
    out = []
    dtype = "bf16"
    for shape in [s for s in config.shapes if s.attention_known][:config.attention_shapes]:
        for chunk, cached in config.prefill:
            out.append(attention.prefill(shape, chunk, cached, dtype, watch, generator))
            echo(out[-1])
        for batch, context in config.decode:
            out.append(attention.decode(shape, batch, context, dtype, watch, generator))
            echo(out[-1])
        for block in config.kv_block_sizes:
            out.append(attention.kv_gather(shape, block, config.kv_gather_bytes, dtype, watch,
                                           generator))
            echo(out[-1])
    return out


def cpu_limits(measurements: list[Measurement], name: str) -> DeviceLimits:
    """A CPU's limits from this run's best samples (see the module docstring): bandwidth from
    the runs whose buffers exceed the last-level cache (copy, read, KV gather: the DRAM
    figure), FLOP/s per dtype from every matrix product, whichever shape showed the best."""
    best_bw = max(m.bytes / min(m.timing.samples_s) for m in measurements
                  if m.bench in ("bandwidth", "kv_gather") and m.timing is not None)
    flops: dict[str, float] = {}
    for m in measurements:
        if m.bench in ("matmul", "peak_matmul") and m.timing is not None and m.dtype:
            flops[m.dtype] = max(flops.get(m.dtype, 0.0), m.flops / min(m.timing.samples_s))
    return measured_limits(
        name, bandwidth_bytes_per_s=best_bw, flops=flops,
        how=("best single sample of the large-buffer runs (copy, read, KV gather; a copy counts "
             "bytes read + written) and, per dtype, of every matrix product in the same "
             "kernels.micro run"))


def run_micro(config: MicroConfig, *, device_name: str, echo: Echo = lambda m: None,
              limits: DeviceLimits | None = None) -> tuple[DeviceLimits | None,
                                                           list[Measurement]]:
    """Run the suite; returns the limits used and every measurement held against them.
    `echo` sees each measurement with its limits: on a GPU as it completes (limits from the
    table's row for `device_name`; none where the table has no row, so no fractions), on a CPU
    all at the end, once the run's own peaks are known."""
    device = torch.device(config.device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        return _run(config, device, device_name, echo, limits)
    finally:
        torch.set_num_threads(threads)


def _run(config: MicroConfig, device: torch.device, device_name: str, echo: Echo,
         limits: DeviceLimits | None) -> tuple[DeviceLimits | None, list[Measurement]]:
    watch = Stopwatch(device, warmup=config.warmup, reps=config.reps)
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed)
    if limits is None and device.type != "cpu":
        limits = limits_for(device_name)
    # a CPU's limits are known only once everything ran: its rows are echoed at the end
    live = limits is not None
    held = limits
    found: list[Measurement] = []

    def keep(m: Measurement) -> None:
        found.append(m.with_limits(held))
        if live:
            echo(found[-1])

    bandwidth(config, watch, generator, keep)
    for m in peak_matmuls(config, watch, generator):
        keep(m)
    matmuls(config, watch, generator, keep)
    attention_runs(config, watch, generator, keep)
    if limits is None and device.type == "cpu":
        limits = cpu_limits(found, device_name)
        found = [m.with_limits(limits) for m in found]
        for m in found:
            echo(m)
    return limits, found
