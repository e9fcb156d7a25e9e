"""`compaction-bench plan RUN_DIR`: the capacity plan of a run folder (`make plan RUN=<id>`).

Parses, builds the config, calls `plan.planner.write_plan` and prints where the files went;
known failures end in one line naming the cause (`common.errors.run_cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.common.resampling import RESAMPLES
from compaction_bench.plan.settings import (
    DEFAULT_AGENTS,
    DEFAULT_SLO,
    PlanConfig,
)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  help="Capacity plan of a run folder: agents per GPU, GPUs needed, per-task "
                  "cost and break-even uses per arm (plan.md, plan.json, plots/).")


@app.command()
def plan(
    run_dir: Annotated[Path, typer.Argument(help="Run folder, e.g. results/<run-id>.")],
    slo: Annotated[str, typer.Option(
        help="latency target: p90:120s (seconds) or p90:2x (times the time alone)")
    ] = DEFAULT_SLO,
    agents: Annotated[int, typer.Option(help="fleet size to plan GPUs for", min=1)
                      ] = DEFAULT_AGENTS,
    gpu_hour_usd: Annotated[float | None, typer.Option(
        help="price of a GPU-hour (default: costs in GPU-seconds)")] = None,
    compressor_usd_per_mtok: Annotated[float | None, typer.Option(
        help="external compressor price per million tokens")] = None,
    costmodel: Annotated[Path | None, typer.Option(
        help="kernels results file: simulate unmeasured levels (kernels/results/*.json)")
    ] = None,
    predict_device: Annotated[str | None, typer.Option(
        help="with --costmodel: also predict on this GPU (kernels/limits.toml)")] = None,
    bootstrap: Annotated[int, typer.Option(help="bootstrap resamples", min=100)
                         ] = RESAMPLES,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap and simulator", min=0)] = 0,
) -> None:
    """Write plan.md, plan.json and plots/plan_*.png into RUN_DIR."""
    from compaction_bench.plan.planner import write_plan

    config = PlanConfig(run_dir=run_dir, slo=slo, agents=agents, gpu_hour_usd=gpu_hour_usd,
                        compressor_usd_per_mtok=compressor_usd_per_mtok, costmodel=costmodel,
                        predict_device=predict_device, bootstrap=bootstrap, seed=seed)
    files = write_plan(config)
    typer.echo(f"plan:  {files.markdown}")
    typer.echo(f"json:  {files.json}")
    if files.plots:
        typer.echo(f"plots: {', '.join(str(p) for p in files.plots)}")

