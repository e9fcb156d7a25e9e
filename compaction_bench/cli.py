"""`compaction-bench`: the suite's one command. Its subcommands are the stages, each defined in
its stage's own `cli.py` and gathered here; the `make` targets call them.

    serve, check, stop, profiles, prepare-model    a vLLM server for a profile (serve/cli.py)
    histories ...                                  agent histories and arm files (histories/)
    bench, report, compare, report-study           runs and their documents (bench/cli.py)
    plan                                           the GPU capacity plan of a run (plan/cli.py)
    kernels ...                                    measured device costs (kernels/cli.py)
    faults                                         injected faults (bench/faults/cli.py)
    measure client|redaction|scorer                the suite's own parts, measured
    load run|worker|merge                          background load across hosts (loadgen/)

Every command ends a known failure with one line naming the cause and the fix, and an exit code
from `common.errors.ExitCode` (`run_cli`).
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from typer.models import CommandInfo

import compaction_bench
from compaction_bench.common.errors import run_cli


def _new_app() -> typer.Typer:
    top = typer.Typer(
        name="compaction-bench", no_args_is_help=True, add_completion=False,
        pretty_exceptions_enable=False,
        help="Does compacting an agent's old reasoning make it finish sooner, and how many GPUs "
        "does the fleet then need? Serve a model, run blocks of arms under load, report, plan.")
    top.callback()(main)
    return top


def _version(value: bool) -> None:
    if value:
        typer.echo(f"compaction-bench {compaction_bench.__version__}")
        raise typer.Exit()


def main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")
         ] = False) -> None:
    """compaction-bench: compaction's effect on agents' time and GPUs, measured."""


def _adopt(app: typer.Typer, source: typer.Typer, names: dict[str, str] | None = None) -> None:
    """Register `source`'s commands at the top level (renamed where `names` says)."""
    for info in source.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
        app.registered_commands.append(CommandInfo(**{
            **info.__dict__, "name": (names or {}).get(name, name)}))


# Which stage's CLI module defines each top-level word: `compaction-bench bench ...` imports
# bench/cli.py alone, not every stage (a stage's imports cost seconds: pandas, scipy,
# matplotlib). A word not here (--help, a typo) builds them all, so help and "No such command"
# see every command.
STAGES = {
    "serve": ("serve", "check", "stop", "profiles", "prepare-model"),
    "histories": ("histories",),
    "bench": ("bench", "report", "compare", "report-study"),
    "plan": ("plan", "plan-check", "fleet-truth"),
    "kernels": ("kernels",),
    "faults": ("faults",),
    "measure": ("measure",),
    "load": ("load",),
}


def build(stages: tuple[str, ...] = tuple(STAGES)) -> typer.Typer:
    """The command with the commands of `stages` (every stage by default)."""
    app = _new_app()
    if "serve" in stages:
        from compaction_bench.serve import cli as serve_cli

        _adopt(app, serve_cli.app)
    if "histories" in stages:
        from compaction_bench.histories import cli as histories_cli

        app.add_typer(histories_cli.app, name="histories")
    if "bench" in stages:
        from compaction_bench.bench import cli as bench_cli

        _adopt(app, bench_cli.app)
    if "plan" in stages:
        from compaction_bench.plan import cli as plan_cli

        _adopt(app, plan_cli.app)
    if "kernels" in stages:
        from compaction_bench.kernels import cli as kernels_cli

        app.add_typer(kernels_cli.app, name="kernels")
    if "faults" in stages:
        from compaction_bench.bench.faults import cli as faults_cli

        _adopt(app, faults_cli.app, {"main": "faults"})
    if "measure" in stages:
        app.add_typer(measure, name="measure")
    if "load" in stages:
        from compaction_bench.loadgen import cli as load_cli

        app.add_typer(load_cli.app, name="load")
    return app


def stage_of(argv: list[str]) -> str | None:
    """The stage whose module defines the command `argv` names (its first word that is not an
    option), or None: every stage is then built."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return next((stage for stage, words in STAGES.items() if word in words), None)


measure = typer.Typer(no_args_is_help=True, add_completion=False,
                      help="Measure the suite's own parts: the streaming client's timing "
                      "accuracy, redaction recall, the proxy scorer's cost.")
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@measure.command("client", context_settings=PASS_THROUGH)
def measure_client(ctx: typer.Context) -> None:
    """The streaming client's timing accuracy against vLLM's and AIPerf's clients (options:
    `compaction-bench measure client --help`)."""
    from compaction_bench.loadgen.client_bench import main as client_main

    client_main(list(ctx.args))


@measure.command("redaction", context_settings=PASS_THROUGH)
def measure_redaction(ctx: typer.Context) -> None:
    """Redaction recall and false positives on the labelled corpus."""
    from compaction_bench.histories.compaction.redaction_bench import app as redaction

    redaction(args=list(ctx.args), standalone_mode=False)


@measure.command("scorer", context_settings=PASS_THROUGH)
def measure_scorer(ctx: typer.Context) -> None:
    """The proxy scorer's seconds per call on this machine's device."""
    from compaction_bench.histories.policies.scorer_bench import app as scorer

    scorer(args=list(ctx.args), standalone_mode=False)


def entry() -> NoReturn:
    """The console script `compaction-bench`: only the named command's stage is imported."""
    import sys

    stage = stage_of(sys.argv[1:])
    run_cli(build((stage,) if stage else tuple(STAGES)))
