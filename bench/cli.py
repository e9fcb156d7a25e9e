"""Command line: `python -m bench.cli report RUN_DIR`, `compare RUN_DIR RUN_DIR...`,
`report-study [--source PATH] [--out DIR]`. Each command parses, calls one library function and
prints where the files went; bad input prints one line naming the path and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.compare import compare_runs
from bench.config import REGIMES, BenchConfig
from bench.records import AnalysisError
from bench.report import ReportFiles, write_report
from bench.study import DEFAULT_OUT, DEFAULT_SOURCE, report_study

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Analyse benchmark run folders: reports, comparisons and the study's own numbers.",
)

Seed = Annotated[int, typer.Option(help="Seed of the bootstrap resampling.")]


def _fail(error: AnalysisError) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(code=1)


def _print_files(files: ReportFiles) -> None:
    typer.echo(f"report:  {files.markdown}")
    typer.echo(f"html:    {files.html}")
    typer.echo(f"summary: {files.summary}")
    if files.plots:
        typer.echo(f"plots:   {files.plots[0].parent}/ ({len(files.plots)} PNG)")


@app.command()
def run(
    regime: Annotated[str, typer.Option(help=f"one of {', '.join(REGIMES)}")] = "dedicated",
    blocks: Annotated[int | None, typer.Option(help="default 5/5/25 on GPU, 2/2/1 on CPU")] = None,
    profile: Annotated[str, typer.Option(help="server profile; 'auto': for this machine")] = "auto",
    port: int = 8000,
    base_url: Annotated[str | None, typer.Option(help="measure this /v1 server instead")] = None,
    task: str = "fix-median",
    arms: Annotated[str, typer.Option(help="comma-separated arms")] = "clean,external,self",
    seed: int = 0,
    run_id: Annotated[str | None, typer.Option(help="name the run folder")] = None,
    resume: Annotated[str | None, typer.Option(help="continue this run id")] = None,
    recover: Annotated[bool, typer.Option(help="re-run failed arms as recovery runs")] = False,
    locust_workers: Annotated[int, typer.Option(help="locust worker processes")] = 0,
    step_limit: Annotated[int | None, typer.Option(help="postfork model calls per arm")] = None,
    cache_salt: Annotated[bool, typer.Option(help="isolate each arm's prefix cache")] = False,
    external_url: Annotated[str | None, typer.Option(
        help="external compressor /v1 URL (default on CPU: embedded Gemma on port+1)")] = None,
    prompt: Annotated[str, typer.Option(help="frozen rewrite prompt name")] = "telegraphic",
) -> None:
    """Run three-arm blocks under a regime; write results/<run-id>/ and its report."""
    from bench.run import BenchError, run_bench  # heavy imports only for this command
    from histories.format import HistoryError
    from histories.tasks import TaskError
    from serve.errors import ServeError

    if regime not in REGIMES:
        typer.echo(f"error: unknown regime '{regime}'; use one of {', '.join(REGIMES)}", err=True)
        raise typer.Exit(2)
    try:
        config = BenchConfig(
            regime=regime, blocks=blocks, profile=profile, port=port, base_url=base_url,
            task=task, arms=tuple(a.strip() for a in arms.split(",") if a.strip()), seed=seed,
            run_id=run_id, resume=resume, recover=recover, locust_workers=locust_workers,
            step_limit=step_limit, cache_salt_per_arm=cache_salt, external_url=external_url,
            prompt=prompt)
        outcome = run_bench(config)
    except (BenchError, ServeError, TaskError, HistoryError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if outcome.report is not None:
        _print_files(outcome.report)
    if outcome.aborted:
        typer.echo(f"error: {outcome.aborted}", err=True)
        raise typer.Exit(1)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run folder, e.g. results/<run-id>.")],
    seed: Seed = 0,
) -> None:
    """Write report.md, report.html, plots/ and summary.json into RUN_DIR."""
    try:
        files = write_report(run_dir, seed=seed)
    except AnalysisError as error:
        raise _fail(error) from None
    _print_files(files)


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Two or more run folders.")],
    out: Annotated[
        Path | None, typer.Option(help="Write the comparison Markdown here instead of printing.")
    ] = None,
    seed: Seed = 0,
) -> None:
    """Put runs of the same task and arms side by side in one table."""
    try:
        text = compare_runs(run_dirs, out, seed=seed)
    except AnalysisError as error:
        raise _fail(error) from None
    typer.echo(f"comparison: {out}" if out is not None else text)


@app.command("report-study")
def report_study_command(
    source: Annotated[Path, typer.Option(help="The study's b300_blocks.json.")] = DEFAULT_SOURCE,
    out: Annotated[Path, typer.Option(help="Run folder to write.")] = DEFAULT_OUT,
    seed: Seed = 0,
) -> None:
    """Import the source study's B300 blocks as a run folder and report on it."""
    try:
        files = report_study(source, out, seed=seed)
    except AnalysisError as error:
        raise _fail(error) from None
    _print_files(files)


if __name__ == "__main__":
    app()
