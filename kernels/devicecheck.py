"""The GPU device check: `kernels/device_check.sh` or `python -m
compaction_bench.kernels.devicecheck`.

Runs on one CUDA GPU with nothing but PyTorch, Triton and nvidia-ml-py (no vLLM, no model
weights, no network), in a few minutes on an H200:
1. the GPU micro-benchmarks (kernels/micro.py `MicroConfig.gpu`) for every shipped model's
   shapes, bf16 and fp8, held against the GPU's row of kernels/limits.toml;
2. the entropy benchmark: fused Triton kernel vs the unfused PyTorch version and the chunked
   reference, at three vocabulary sizes (kernels/entropy.py);
3. ten seconds of the bench's NVML sampler (`serve.gpu.GpuSampler`) around a bf16 matmul
   loop: what it recorded goes into the results, so that code meets a real GPU once;
and writes `data/kernels/<gpu>__micro__torch-<version>.json` (kernels/SCHEMA.md).
On a machine without a CUDA GPU it ends with one line saying so and exit code 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import ExitCode, SuiteError, UnavailableError, fail
from compaction_bench.common.files import read_jsonl
from compaction_bench.kernels.resultfile import (
    file_name,
    kernel_results_dir,
    new_document,
    write_results,
)
from compaction_bench.serve.hardware import driver_version

NO_GPU = "needs a CUDA GPU; on this machine run `make kernels`"
ENTROPY_SHAPES = [(4096, 49152), (4096, 151936), (2048, 262144)]


def require_cuda() -> None:
    """Raise `UnavailableError` (one line, exit 3) unless PyTorch sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise UnavailableError(f"{NO_GPU} (PyTorch is not installed here)") from None
    if not torch.cuda.is_available():
        raise UnavailableError(NO_GPU)


def gpu_facts() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    facts: dict[str, Any] = {
        "type": "cuda", "name": props.name, "capability": f"{props.major}.{props.minor}",
        "memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
        "cuda": torch.version.cuda, "count": torch.cuda.device_count()}
    # a fact, not a requirement: the check runs where NVML cannot be opened too
    facts["driver"] = driver_version() or "unknown (NVML unavailable)"
    return facts


def telemetry_around_matmul(seconds: float, say: Any) -> dict[str, Any]:
    """The NVML sampler for `seconds`: idle 1 s, a bf16 8192^3 matmul loop, idle 1 s."""
    import torch

    from compaction_bench.serve.gpu import GpuSampler

    device = torch.device("cuda")
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpu.jsonl"
        origin = time.monotonic()
        with GpuSampler(path, interval_s=0.5, origin=origin) as sampler:
            time.sleep(1.0)
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
            loop_began = time.monotonic() - origin
            start.record()
            count = 0
            while time.monotonic() - origin < seconds - 1.0:
                for _ in range(10):
                    torch.matmul(a, b)
                count += 10
                torch.cuda.synchronize()
            end.record()
            end.synchronize()
            loop_ended = time.monotonic() - origin
            time.sleep(max(0.0, seconds - (time.monotonic() - origin)))
            enabled, reason = sampler.enabled, sampler.reason
        rows = read_jsonl(path).objects
    elapsed = start.elapsed_time(end) / 1000.0
    flops = 2.0 * 8192**3 * count / elapsed
    say(f"[telemetry] {len(rows)} NVML rows over {seconds:.0f} s around {count} bf16 8192^3 "
        f"matmuls ({flops / 1e12:.0f} TFLOP/s); sampler enabled={enabled}")
    return {"sampler": "compaction_bench.serve.gpu.GpuSampler", "interval_s": 0.5,
            "seconds": seconds,
            "enabled": enabled, "reason": reason, "samples": rows,
            "matmul_loop": {"n": 8192, "dtype": "bf16", "count": count, "began_s": loop_began,
                            "ended_s": loop_ended, "device_seconds": elapsed,
                            "flops_per_s": flops}}


def run_device_check(out_dir: Path, *, quick: bool, sampler_seconds: float,
                     argv: list[str], say: Any = print) -> Path:
    """Run the check (module docstring) and write its results file; returns its path."""
    require_cuda()
    import torch

    from compaction_bench.kernels.entropy import benchmark_entropy
    from compaction_bench.kernels.limits import limits_for
    from compaction_bench.kernels.measurement import HEADER, row
    from compaction_bench.kernels.micro import MicroConfig, run_micro
    from compaction_bench.kernels.shapes import distinct_shapes
    from compaction_bench.kernels.stopwatch import Stopwatch

    device = gpu_facts()
    device["slug"] = device["name"]
    limits = limits_for(device["name"])
    document = new_document("device-check", device, argv, quick=quick)
    if limits is None:
        document["notes"].append(f"kernels/limits.toml has no row matching {device['name']!r}:"
                                 " measurements carry no fraction of a limit")
    shapes = tuple(distinct_shapes())
    config = MicroConfig.gpu(shapes)
    if quick:
        config = dataclasses.replace(config, token_counts=(1, 128, 8192), reps=5,
                                     prefill=((2048, 8192),), decode=((32, 8192),),
                                     attention_shapes=1, bandwidth_bytes=1 << 30)
    say(HEADER)
    limits, found = run_micro(config, device_name=device["name"], limits=limits,
                              echo=lambda m: say(row(m)))
    document["limits"] = limits.to_json() if limits is not None else None
    document["micro"] = {"config": config.to_json(),
                         "measurements": [m.to_json() for m in found]}
    watch = Stopwatch(torch.device("cuda"), warmup=3, reps=5 if quick else 20)
    entropy = benchmark_entropy(watch, ENTROPY_SHAPES[:1] if quick else ENTROPY_SHAPES)
    for item in entropy:
        runs = item["runs"]
        say(f"[entropy] {item['rows']}x{item['vocab']} {item['dtype']}: " + ", ".join(
            f"{name} {r['timing']['median_s'] * 1e3:.3f} ms "
            f"(max error {r['max_abs_error_vs_float64']:.1e})" for name, r in runs.items()))
        if limits is not None:
            for r in runs.values():
                r["fraction_bytes"] = r["bytes_per_s"] / limits.hbm_bytes_per_s
    document["entropy"] = {"shapes": entropy, "note": "bytes = logits read once; the unfused "
                           "version moves several times that (softmax and log-softmax in "
                           "float32 written and read)"}
    document["telemetry"] = telemetry_around_matmul(sampler_seconds, say)
    path = out_dir / file_name(device["name"], "micro", f"torch-{torch.__version__}")
    write_results(document, path)
    say(f"[kernels] wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="kernels/device_check.sh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where the results file goes (default: data/kernels/)")
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (a minute)")
    parser.add_argument("--sampler-seconds", type=float, default=10.0,
                        help="NVML sampling around the matmul loop (default 10)")
    args = parser.parse_args(args_list)
    try:
        run_device_check(args.out_dir or kernel_results_dir(), quick=args.quick,
                         sampler_seconds=args.sampler_seconds, argv=["device_check", *args_list])
    except SuiteError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        fail("interrupted", ExitCode.INTERRUPTED)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
