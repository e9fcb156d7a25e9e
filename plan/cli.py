"""`compaction-bench plan RUN_DIR`: the capacity plan of a run folder (`make plan RUN=<id>`);
`plan-check` and `fleet-truth`.

Settings are written as the bench's are (common/settings.py): each declared once, as a field of
PlanConfig or TruthConfig, and given as `name=value` words or, through make, as its variable
(`make plan RUN=x SLO=p90:120s` is `compaction-bench plan results/x slo=p90:120s`). Known
failures end in one line naming the cause (`common.errors.run_cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.common.options import (
    ConfigFile,
    FromEnv,
    ShowSettings,
    alias,
    settings_from,
    show_settings,
    split_words,
    words_help,
)
from compaction_bench.plan.settings import PlanCheckConfig, PlanConfig
from compaction_bench.plan.truth import TruthConfig

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  help="Capacity plan of a run folder: agents per GPU, GPUs needed, per-task "
                  "cost and break-even uses per arm (plan.md, plan.html, plan.json, plots/).")


@app.command()
def plan(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run folder, e.g. results/<run-id>.", show_default=False)] = None,
    settings: Annotated[list[str] | None, typer.Argument(help=words_help(
        "slo=p90:120s agents=40 fleet_replicas=2,4,8"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
) -> None:
    """Write plan.md, plan.html, plan.json and plots/plan_*.png into RUN_DIR."""
    if show:
        show_settings(PlanConfig)
        return
    if run_dir is None:
        raise typer.BadParameter("give the run folder: compaction-bench plan results/<run-id>",
                                 param_hint="RUN_DIR")
    from compaction_bench.plan.observations import HOST_NOTE
    from compaction_bench.plan.write import write_plan

    config = settings_from(PlanConfig, "plan", words=settings, file=config_file,
                           from_env=from_env, given={"run_dir": run_dir})
    files = write_plan(config)
    for line in files.markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"> {HOST_NOTE}"):  # contended cells: said where the user looks
            typer.echo(line.removeprefix("> "))
    typer.echo(f"plan:  {files.markdown}")
    typer.echo(f"html:  {files.html}")
    typer.echo(f"json:  {files.json}")
    if files.plots:
        typer.echo(f"plots: {', '.join(str(p) for p in files.plots)}")


@app.command("plan-check")
def plan_check(
    ctx: typer.Context,
    plan_run: Annotated[Path, typer.Argument(help="the one-replica sweep the plan comes from")],
    check_runs: Annotated[list[str], typer.Argument(
        help="sweep runs through the router at the planned fleet (one per routing policy), "
        "then any settings as name=value (replicas=2)", show_default=False)],
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    replicas: Annotated[int | None, alias("replicas")] = None,
) -> None:
    """Check a one-replica plan against runs through the router: predicted vs measured SLO
    quantile per arm and routing policy, with the plan's own settings.

    The settings are the plan's plan.json; the check is written to plan_check.md/json in
    PLAN_RUN, and the plan itself is not rewritten."""
    from compaction_bench.plan.check import check_notes, plan_settings, write_check

    paths, words = split_words(check_runs)
    own = settings_from(PlanCheckConfig, "plan check", words=words, file=config_file,
                        from_env=from_env, flags=ctx.params)
    runs = [Path(r) for r in paths]
    if not runs:
        raise typer.BadParameter("give the sweep runs through the router after the plan's run: "
                                 "compaction-bench plan check results/<plan> results/<check>...",
                                 param_hint="CHECK_RUNS")
    config = plan_settings(plan_run)
    markdown, document, rows = write_check(config, runs, own.replicas)
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


@app.command("fleet-truth")
def fleet_truth(
    settings: Annotated[list[str] | None, typer.Argument(help=words_help(
        "replicas=2,4 policies=round_robin slots=2 cache_discount=0.8"),
        show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
) -> None:
    """The fleet plan against fleets of fake replicas of known capacity behind the real
    vllm-router: one replica swept and planned, then each fleet's true capacity measured from
    the planned N outward.

    The table (fleet-truth.md): policy | replicas | arm | true agents | planned agents | error |
    SLO held at planned N."""
    if show:
        show_settings(TruthConfig)
        return
    import sys

    from compaction_bench.plan.truth import TRUTH_MD, run_truth, truth_markdown

    config = settings_from(TruthConfig, "fleet-truth", words=settings, file=config_file,
                           from_env=from_env)
    rows = run_truth(config, sys.stderr)
    typer.echo(truth_markdown(config, rows))
    typer.echo(f"truth: {config.out / TRUTH_MD}")
