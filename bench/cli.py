"""`python -m compaction_bench.bench.cli`: run blocks (`run`), report on a run folder (`report`),
put runs side
by side (`compare`) and report the study's own B300 records (`report-study`). Each command
parses, builds the config, calls one library function and prints where the files went; known
failures end with one line naming the cause (`common.errors.run_cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.bench.run.config import REGIMES, SWEEP, BenchConfig
from compaction_bench.common.errors import ExitCode, SuiteError, run_cli

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run blocks under a regime, and analyse run folders: reports, comparisons and the "
    "study's own numbers.",
)

Seed = Annotated[int, typer.Option(help="Seed of the bootstrap resampling.")]


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


@app.command()
def run(
    regime: Annotated[str | None, typer.Option(
        help=f"one of {', '.join(REGIMES)} (default dedicated), or {SWEEP}: the "
        "load-response sweep for `make plan`")] = None,
    blocks: Annotated[int | None, typer.Option(
        help="default 5/5/25 on GPU, 2/2/1 on CPU", min=1)] = None,
    profile: Annotated[str, typer.Option(help="server profile; 'auto': for this machine")] = "auto",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    base_url: Annotated[str | None, typer.Option(
        help="measure this server instead (with or without /v1)")] = None,
    task: Annotated[str | None, typer.Option(help="task id (default fix-median)")] = None,
    arms: Annotated[str | None, typer.Option(
        help="comma-separated arms (default clean,external,self)")] = None,
    seed: Annotated[int | None, typer.Option(help="the run seed (default 0)", min=0)] = None,
    run_id: Annotated[str | None, typer.Option(help="name the run folder")] = None,
    resume: Annotated[str | None, typer.Option(
        help="continue this run id (its own settings, unless given again)")] = None,
    recover: Annotated[bool, typer.Option(help="re-run failed arms as recovery runs")] = False,
    locust_workers: Annotated[int, typer.Option(help="locust worker processes", min=0)] = 0,
    step_limit: Annotated[int | None, typer.Option(
        help="postfork model calls per arm", min=1)] = None,
    seeds: Annotated[str | None, typer.Option(
        help="common (default): the arms of a block share a sampling seed; independent")
    ] = None,
    cache: Annotated[str | None, typer.Option(
        help="shared (default): arms share the prefix cache; isolated: a cache_salt per arm "
        "and attempt; run: one cache_salt per run (starts cold)")] = None,
    protocol: Annotated[str | None, typer.Option(
        help="strict: the first protocol error fails an arm; lenient (default on CPU)")] = None,
    rewrite_cache: Annotated[str | None, typer.Option(
        help="fresh (default): every continuation pays its rewriting; reuse: the task's cache")
    ] = None,
    external_url: Annotated[str | None, typer.Option(
        help="external compressor URL (default on CPU: embedded Gemma on port+1)")] = None,
    prompt: Annotated[str | None, typer.Option(
        help="frozen rewrite prompt name (default telegraphic)")] = None,
    selfcheck: Annotated[bool, typer.Option(
        help="check the server (names, prefix cache, parsers) before the first block")] = True,
    speculative: Annotated[bool | None, typer.Option(
        "--speculative/--no-speculative", help="the profile's opt-in speculative decoding")
    ] = None,
    expert_parallel: Annotated[bool | None, typer.Option(
        "--expert-parallel/--no-expert-parallel", help="the profile's opt-in expert parallelism")
    ] = None,
    token_ids: Annotated[bool | None, typer.Option(
        "--token-ids/--no-token-ids", help="ask for each arm request's token ids "
        "(return_token_ids) for cache-break accounting (default on)")] = None,
    levels: Annotated[str | None, typer.Option(
        help="sweep: fleet sizes, e.g. 1,2,4,8 (default: powers of two to 2 x max_num_seqs)")
    ] = None,
    sweep_min_continuations: Annotated[int | None, typer.Option(
        help="sweep: measured continuations per arm and level (default 8)", min=1)] = None,
    sweep_level_s: Annotated[float | None, typer.Option(
        help="sweep: keep measuring a level at least this long (default 0)", min=0)] = None,
    sweep_warmup: Annotated[int | None, typer.Option(
        help="sweep: warm-up continuations per agent and level (default 1)", min=0)] = None,
    stream_deadline: Annotated[float | None, typer.Option(
        help="seconds of silence after which a target stream is cut (default 600)")] = None,
    compressor_deadline: Annotated[float | None, typer.Option(
        help="the same for compressor streams (default 300)")] = None,
    arm_wall: Annotated[float | None, typer.Option(
        help="longest postfork time of one arm, then TimeExceeded (default 3600)")] = None,
    stall: Annotated[float | None, typer.Option(
        help="watchdog: stop when the server streams nothing this long (default 120)")] = None,
    fast_start: Annotated[bool | None, typer.Option(
        "--fast-start/--no-fast-start", help="start the server uncompiled (-O0): a quick "
        "first look, marked in the report; steps are slower")] = None,
) -> None:
    """Run blocks of arms under a regime; write results/<run-id>/ and its report."""
    from compaction_bench.bench.run.runner import run_bench  # heavy imports only for this command

    if regime is not None and regime not in (*REGIMES, SWEEP):
        raise SuiteError(f"unknown regime '{regime}'; use one of {', '.join(REGIMES)} or "
                         f"{SWEEP}")
    sweep = {k: v for k, v in {
        "levels": None if levels is None else _levels(levels),
        "min_continuations": sweep_min_continuations, "level_s": sweep_level_s,
        "warmup": sweep_warmup}.items() if v is not None}
    given = {"regime": regime, "blocks": blocks, "server_url": base_url, "task": task,
             "arms": None if arms is None else tuple(a.strip() for a in arms.split(",")
                                                     if a.strip()),
             "seed": seed, "run_id": run_id, "resume": resume, "step_limit": step_limit,
             "external_url": external_url, "prompt": prompt, "seeds": seeds, "cache": cache,
             "protocol": protocol, "rewrite_cache": rewrite_cache, "speculative": speculative,
             "expert_parallel": expert_parallel, "stream_deadline_s": stream_deadline,
             "compressor_deadline_s": compressor_deadline, "arm_wall_s": arm_wall,
             "stall_s": stall, "sweep": sweep or None, "fast_start": fast_start,
             "token_ids": token_ids}
    config = BenchConfig.model_validate({
        "profile": profile, "port": port, "recover": recover, "locust_workers": locust_workers,
        "selfcheck": selfcheck,
        **{k: v for k, v in given.items() if v is not None}})
    outcome = run_bench(config)
    if outcome.report is not None:
        _print_files(outcome.report)
    if outcome.aborted:
        typer.echo(f"error: {outcome.aborted}", err=True)
        raise typer.Exit(outcome.exit_code or ExitCode.FAILED)


def _levels(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SuiteError(f"LEVELS={text!r}: give fleet sizes as integers, e.g. LEVELS=1,2,4,8"
                         ) from None


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run folder, e.g. results/<run-id>.")],
    seed: Seed = 0,
) -> None:
    """Write report.md, report.html, plots/, requests.parquet and summary.json into RUN_DIR."""
    from compaction_bench.bench.report.run_report import write_report

    _print_files(write_report(run_dir, seed=seed))


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Two or more run folders.")],
    out: Annotated[
        Path | None, typer.Option(help="Write the comparison Markdown here instead of printing.")
    ] = None,
    seed: Seed = 0,
) -> None:
    """Put runs of the same task and arms side by side in one table."""
    from compaction_bench.bench.report.compare import compare_runs

    text = compare_runs(run_dirs, out, seed=seed)
    typer.echo(f"comparison: {out}" if out is not None else text)


@app.command("report-study")
def report_study_command(
    source: Annotated[Path | None, typer.Option(
        help="The study's b300_blocks.json (default: data/study/b300_blocks.json).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Run folder to write (default: results/study-b300).")] = None,
    seed: Seed = 0,
) -> None:
    """Import the source study's B300 blocks as a run folder and report on it."""
    from compaction_bench.bench.report.run_report import report_study

    _print_files(report_study(source, out, seed=seed))


if __name__ == "__main__":
    run_cli(app)
