"""The bench's commands: `bench` (one run: blocks under a regime, or the sweep), `report` on a
run folder, `compare` runs side by side and `report-study` (the study's own B300 records). Each
parses, builds the config, calls one library function and prints where the files went; known
failures end with one line naming the cause (`common.errors.run_cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.bench.report.settings import CompareConfig, ReportConfig, StudyReportConfig
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.errors import ExitCode
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

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run blocks under a regime, and analyse run folders: reports, comparisons and the "
    "study's own numbers.",
)

def _print_files(files: object) -> None:
    from compaction_bench.bench.report.run_report import ReportFiles

    assert isinstance(files, ReportFiles)
    typer.echo(f"report:  {files.markdown}")
    typer.echo(f"html:    {files.html}")
    typer.echo(f"summary: {files.summary}")
    if files.table is not None:
        typer.echo(f"table:   {files.table}")
    if files.plots:
        typer.echo(f"plots:   {files.plots[0].parent}/ ({len(files.plots)} PNG)")


def _print_outcome(found: object) -> None:
    """One run's report files, or with ROUTER_POLICY each policy's and the comparison."""
    from compaction_bench.bench.run.routing import RoutedRuns

    if not isinstance(found, RoutedRuns):
        _print_files(found)
        return
    for policy, outcome in found.outcomes.items():
        typer.echo(f"[{policy}] run folder: {outcome.run_dir}")
        if outcome.report is not None:
            _print_files(outcome.report)
    for policy, why in found.missing.items():
        typer.echo(f"[{policy}] {why}")
    if found.text is not None:
        typer.echo("")
        typer.echo(found.text)
        typer.echo(f"routing comparison: {found.comparison}")


@app.command("bench")
def run(
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("regime=overloaded blocks=3 arms=clean,self"), show_default=False)
    ] = None,
    config: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
) -> None:
    """Run blocks of arms under a regime (or the load-response sweep); write
    results/<run-id>/ and its report."""
    if show:
        show_settings(BenchConfig)
        return
    # bad settings fail before the heavy imports; a platform's PORT or SEED: said, not taken
    chosen = settings_from(BenchConfig, "bench", words=settings, file=config, from_env=from_env)
    from compaction_bench.bench.report.routing import compare_policies  # the heavy imports
    from compaction_bench.bench.report.run_report import write_report
    from compaction_bench.bench.run.runner import run_bench

    outcome = run_bench(chosen, report=lambda run_dir, seed: write_report(run_dir, seed=seed),
                        compare=compare_policies)
    if outcome.report is not None:
        _print_outcome(outcome.report)
    if outcome.aborted:
        typer.echo(f"error: {outcome.aborted}", err=True)
        raise typer.Exit(outcome.exit_code or ExitCode.FAILED)


@app.command()
def report(
    ctx: typer.Context,
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run folder, e.g. results/<run-id>.", show_default=False)] = None,
    settings: Annotated[list[str] | None, typer.Argument(help=words_help("seed=3"),
                                                         show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    seed: Annotated[int | None, alias("seed")] = None,
) -> None:
    """Write report.md, report.html, plots/, requests.parquet and summary.json into RUN_DIR."""
    from compaction_bench.bench.report.run_report import write_report

    if show:
        show_settings(ReportConfig)
        return
    if run_dir is None:
        raise typer.BadParameter("give the run folder: compaction-bench report results/<id>",
                                 param_hint="RUN_DIR")
    c = settings_from(ReportConfig, "report", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    _print_files(write_report(run_dir, seed=c.seed))


@app.command()
def compare(
    ctx: typer.Context,
    args: Annotated[list[str] | None, typer.Argument(
        help="Two or more run folders, then any settings as name=value (out=cmp.md seed=3).",
        show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    out: Annotated[Path | None, alias("out")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
) -> None:
    """Put runs of the same task and arms side by side in one table."""
    from compaction_bench.bench.report.compare import compare_runs

    if show:
        show_settings(CompareConfig)
        return
    paths, words = split_words(args)
    if not paths:
        raise typer.BadParameter("give the run folders: compaction-bench compare results/<a> "
                                 "results/<b>", param_hint="RUN_DIRS")
    c = settings_from(CompareConfig, "compare", words=words, file=config_file,
                      from_env=from_env, flags=ctx.params)
    text = compare_runs([Path(p) for p in paths], c.out, seed=c.seed)
    typer.echo(f"comparison: {c.out}" if c.out is not None else text)


@app.command("report-study")
def report_study_command(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("out=results/study-b300 seed=3"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    source: Annotated[Path | None, alias("source")] = None,
    out: Annotated[Path | None, alias("out")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
) -> None:
    """Import the source study's B300 blocks as a run folder and report on it."""
    from compaction_bench.bench.report.run_report import report_study

    if show:
        show_settings(StudyReportConfig)
        return
    c = settings_from(StudyReportConfig, "study report", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    _print_files(report_study(c.source, c.out, seed=c.seed))


@app.command("gpu-check")
def gpu_check_command(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("profile=b300-deepseek-v4-flash-0731 agent_blocks=0"),
        show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
) -> None:
    """A GPU owner's first hour in one command: serve and self-check the profile, check NVML,
    replay two blocks and run one live-agent block; write gpu-check.md naming each step."""
    from compaction_bench.bench.gpucheck import GpuCheckConfig, exit_code, run_gpu_check

    if show:
        show_settings(GpuCheckConfig)
        return
    config = settings_from(GpuCheckConfig, "gpu-check", words=settings, file=config_file,
                           from_env=from_env, flags=ctx.params)
    out, steps = run_gpu_check(config, lambda line: typer.echo(line, err=True))
    for step in steps:
        typer.echo(f"{step.check}: {step.status}")
    typer.echo(f"checklist: {out / 'gpu-check.md'}")
    raise typer.Exit(exit_code(steps))
