"""`compaction-bench plan RUN_DIR`: the capacity plan of a run folder (`make plan RUN=<id>`).

Parses, builds the config, calls `plan.write.write_plan` and prints where the files went;
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
    from compaction_bench.plan.observations import HOST_NOTE
    from compaction_bench.plan.write import write_plan

    config = PlanConfig(run_dir=run_dir, slo=slo, slo_time=slo_time,  # type: ignore[arg-type]
                        extrapolation=extrapolation, agents=agents, gpu_hour_usd=gpu_hour_usd,
                        compressor_usd_per_mtok=compressor_usd_per_mtok, costmodel=costmodel,
                        predict_device=predict_device, bootstrap=bootstrap, seed=seed,
                        fleet_replicas=_ints(fleet_replicas, "FLEET_REPLICAS"),
                        fleet_policies=_words(fleet_policies),
                        replica_urls=_words(replica_urls) if replica_urls else None)
    files = write_plan(config)
    for line in files.markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"> {HOST_NOTE}"):  # contended cells: said where the user looks
            typer.echo(line.removeprefix("> "))
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
    quantile per arm and routing policy, with the plan's own settings.

    The settings are the plan's plan.json; the check is written to plan_check.md/json in
    PLAN_RUN, and the plan itself is not rewritten."""
    from compaction_bench.plan.check import check_notes, plan_settings, write_check

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
    for note in check_notes(markdown):
        typer.echo(note)
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


@app.command("fleet-truth")
def fleet_truth(
    out: Annotated[Path, typer.Option(help="folder for the runs and fleet-truth.md/json")
                   ] = Path("results/fleet-truth"),
    replicas: Annotated[str, typer.Option(help="fleet sizes R, comma-separated")] = "2,4,8",
    policies: Annotated[str, typer.Option(help="router policies, comma-separated")
                        ] = "round_robin,consistent_hash,cache_aware",
    arms: Annotated[str, typer.Option(help="arms, comma-separated")] = "clean,external",
    slots: Annotated[int, typer.Option(help="the fake engine's sequence slots")] = 4,
    prefill_ms_per_token: Annotated[float, typer.Option(
        help="prefill cost of an uncached prompt token, ms")] = 0.2,
    cache_discount: Annotated[float, typer.Option(
        help="a cached token costs (1 - this) x the prefill cost")] = 1.0,
    step_ms: Annotated[float, typer.Option(help="a decode step's base cost, ms")] = 2.0,
    step_ms_per_seq: Annotated[float, typer.Option(
        help="a decode step's cost per running sequence, ms")] = 0.25,
    levels: Annotated[str, typer.Option(help="the one-replica sweep's levels")] = "1,2,4,8",
    min_continuations: Annotated[int, typer.Option(
        help="measured continuations per level at least")] = 16,
    slo: Annotated[str, typer.Option(help="latency target, as make plan's")] = DEFAULT_SLO,
    seed: Annotated[int, typer.Option(help="run and simulator seed", min=0)] = 0,
    port: Annotated[int, typer.Option(help="first port of the fake replicas")] = 18600,
) -> None:
    """The fleet plan against fleets of fake replicas of known capacity behind the real
    vllm-router: one replica swept and planned, then each fleet's true capacity measured from
    the planned N outward.

    The table (fleet-truth.md): policy | replicas | arm | true agents | planned agents | error |
    SLO held at planned N."""
    import sys

    from pydantic import ValidationError

    from compaction_bench.plan.settings import PlanError
    from compaction_bench.plan.truth import TRUTH_MD, TruthConfig, run_truth, truth_markdown

    try:
        config = TruthConfig(
            out=out, replicas=_ints(replicas, "--replicas"), policies=_words(policies),
            arms=_words(arms), slots=slots, prefill_ms_per_token=prefill_ms_per_token,
            cache_discount=cache_discount, step_ms=step_ms, step_ms_per_seq=step_ms_per_seq,
            levels=_ints(levels, "--levels"), min_continuations=min_continuations, slo=slo,
            seed=seed, port=port)
    except ValidationError as error:
        first = error.errors()[0]
        raise PlanError(f"fleet-truth --{str(first['loc'][0]).replace('_', '-')}: "
                        f"{first['msg']}") from None
    rows = run_truth(config, sys.stderr)
    typer.echo(truth_markdown(config, rows))
    typer.echo(f"truth: {config.out / TRUTH_MD}")
