"""Command line: `python -m bench.cli report RUN_DIR`, `compare RUN_DIR RUN_DIR...`,
`report-study [--source PATH] [--out DIR]`. Each command parses, calls one library function and
prints where the files went; bad input prints one line naming the path and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.compare import compare_runs
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
