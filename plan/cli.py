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
    DEFAULT_EXTRAPOLATION,
    DEFAULT_SLO,
    DEFAULT_SLO_TIME,
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
    slo_time: Annotated[str, typer.Option(
        help="the time the SLO bounds: wall (postfork + inline rewriting) or postfork")
    ] = DEFAULT_SLO_TIME,
    extrapolation: Annotated[float, typer.Option(
        help="extrapolate at most this multiple of the largest measured level", min=1.0)
    ] = DEFAULT_EXTRAPOLATION,
    fleet_replicas: Annotated[str, typer.Option(
        help="fleets to plan behind vLLM's router: replicas, comma-separated (e.g. 2,4,8); "
        "'' for none")] = "2",
    fleet_policies: Annotated[str, typer.Option(
        help="router policies to plan each fleet under, comma-separated")
    ] = "round_robin,consistent_hash",
    replica_urls: Annotated[str | None, typer.Option(
        help="the fleet's replica URLs, comma-separated, for consistent_hash's ring (default: "
        "make serve REPLICAS=R's on port 8000)")] = None,
) -> None:
    """Write plan.md, plan.json and plots/plan_*.png into RUN_DIR."""
    from compaction_bench.plan.planner import write_plan

    config = PlanConfig(run_dir=run_dir, slo=slo, slo_time=slo_time,  # type: ignore[arg-type]
                        extrapolation=extrapolation, agents=agents, gpu_hour_usd=gpu_hour_usd,
                        compressor_usd_per_mtok=compressor_usd_per_mtok, costmodel=costmodel,
                        predict_device=predict_device, bootstrap=bootstrap, seed=seed,
                        fleet_replicas=_ints(fleet_replicas, "FLEET_REPLICAS"),
                        fleet_policies=_words(fleet_policies),
                        replica_urls=_words(replica_urls) if replica_urls else None)
    files = write_plan(config)
    typer.echo(f"plan:  {files.markdown}")
    typer.echo(f"json:  {files.json}")
    if files.plots:
        typer.echo(f"plots: {', '.join(str(p) for p in files.plots)}")



@app.command("plan-check")
def plan_check(
    plan_run: Annotated[Path, typer.Argument(help="the one-replica sweep the plan comes from")],
    check_runs: Annotated[list[Path], typer.Argument(
        help="sweep runs through the router at the planned fleet (one per routing policy)")],
    replicas: Annotated[int | None, typer.Option(
        help="replicas behind the router, where the check runs' manifests do not say", min=1)
    ] = None,
) -> None:
    """Check a one-replica plan against runs through the router: predicted vs measured SLO
    quantile per arm and routing policy, with the plan's own settings (its plan.json), written
    to plan_check.md/json in PLAN_RUN; the plan itself is not rewritten."""
    from compaction_bench.plan.check import plan_settings, write_check

    config = plan_settings(plan_run)
    markdown, document, rows = write_check(config, check_runs, replicas)
    for r in rows:
        error = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
        measured = "missed (failures)" if r.measured_s is None else f"{r.measured_s:.1f} s"
        predicted = "beyond measured range" if r.predicted_s is None else (
            f"{r.predicted_s:.1f} s")
        typer.echo(f"{r.policy} x{r.replicas} {r.arm} N={r.level}: predicted {predicted}, "
                   f"measured {measured}, SLO {'held' if r.held else 'MISSED'}, prediction "
                   f"error {error} (n={r.n})")
    typer.echo(f"check: {markdown}")
    typer.echo(f"json:  {document}")
    typer.echo(f"plan.md is unchanged; make the plan again (make plan RUN={plan_run.name}) "
               "for it to state the policy it was checked under")


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(w) for w in _words(text))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give whole numbers, comma-separated (e.g. 2,4,8)",
                                 param_hint=name) from None
