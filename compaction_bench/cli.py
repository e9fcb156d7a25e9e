"""`compaction-bench`: the suite's one command. Its subcommands come from the stages, each
defined in its stage's own `cli.py` and gathered here; the `make` targets call them. `COMMANDS`
is the one list of them: each word, the stage that defines it, and its line of help.

Every command ends a known failure with one line naming the cause and the fix, and an exit code
from `common.errors.ExitCode` (`run_cli`).
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from typer.models import CommandInfo

import compaction_bench
from compaction_bench.common.errors import ExitCode, fail, run_cli


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


# Commands grouped the way vLLM groups its own (`vllm bench serve`): the spelling a user types,
# and the command name a stage's CLI defines. The grouped spelling is the command's name; the old
# flat word stays as a hidden alias for one release, and saying it prints which spelling to use.
GROUPED: dict[tuple[str, str], str] = {
    ("serve", "check"): "check",
    ("plan", "check"): "plan-check",
    ("study", "import"): "import-study",
    ("study", "report"): "report-study",
}
RENAMED: dict[str, str] = {flat: " ".join(words) for words, flat in GROUPED.items()}
ALIASES_UNTIL = "0.2.0"  # the release that drops the flat names


def canonical(argv: list[str]) -> list[str]:
    """`argv` with a grouped spelling (`plan check RUN ...`) made the one word its command is
    registered under (`"plan check"`). Only the first two words are read: a run folder named
    `check` is written `plan ./check`. `study` alone, or with a word it lacks, is refused in one
    line naming its subcommands."""
    if argv and argv[0] == "study" and (len(argv) < 2 or ("study", argv[1]) not in GROUPED):
        fail("compaction-bench study: give a subcommand: study import (the study's records "
             "into data/histories/study) or study report (its B300 blocks as a run folder)",
             ExitCode.USAGE)
    if len(argv) >= 2 and (argv[0], argv[1]) in GROUPED:
        return [f"{argv[0]} {argv[1]}", *argv[2:]]
    return list(argv)


def _adopt(app: typer.Typer, source: typer.Typer, names: dict[str, str] | None = None,
           only: set[str] | None = None, alias: bool = True) -> None:
    """Register `source`'s commands at the top level (renamed where `names` or `RENAMED` says;
    only those named in `only`, where given). A renamed top-level command keeps its old name as
    a hidden, deprecated alias (`alias`; a group's own command keeps its alias in its group)."""
    for info in source.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
        if only is not None and name not in only:
            continue
        name = (names or {}).get(name, name)
        fields = {**info.__dict__, "hidden": False, "deprecated": False}
        app.registered_commands.append(CommandInfo(**{**fields, "name": RENAMED.get(name, name)}))
        if alias and name in RENAMED:
            app.registered_commands.append(CommandInfo(**{
                **fields, "name": name, "hidden": True,
                "deprecated": f"Use `compaction-bench {RENAMED[name]}`; `{name}` goes in "
                              f"{ALIASES_UNTIL}."}))


# Every top-level word: the stage whose CLI module defines it, and its line of help.
# `compaction-bench bench ...` imports bench/cli.py alone, not every stage (a stage's imports cost
# seconds: pandas, scipy, matplotlib); `compaction-bench --help`, no word or an unknown one
# imports none and lists these lines (`index`; a test keeps each equal to the command's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "Serve a profile: the target and compressor names from one engine, "
              "self-checked."),
    "serve check": ("serve", "Self-check a running server against a profile (what `make serve` "
                    "runs once healthy)."),
    "stop": ("serve", "Stop background servers started by this checkout (all, or the one on "
             "--port)."),
    "profiles": ("serve", "List the shipped profiles."),
    "prepare-model": ("serve", "Make the profile's model ready locally (converts an embedded "
                      "model once)."),
    "histories": ("histories", "Agent histories: acquire to a fork, write arms, audit, import, "
                  "export, continue."),
    "bench": ("bench", "Run blocks of arms under a regime (or the load-response sweep); write "
              "results/<run-id>/ and its report."),
    "report": ("bench", "Write report.md, report.html, plots/, requests.parquet and "
               "summary.json into RUN_DIR."),
    "compare": ("bench", "Put runs of the same task and arms side by side in one table."),
    "study report": ("bench", "Import the source study's B300 blocks as a run folder and report "
                     "on it."),
    "study import": ("histories", "Convert every study record into "
                     "<out>/study/<record>/{clean,external}.json."),
    "gpu-check": ("bench", "A GPU owner's first hour in one command: serve and self-check the "
                  "profile, check NVML, replay two blocks and run one live-agent block; write "
                  "gpu-check.md naming each step."),
    "plan": ("plan", "Write plan.md, plan.html, plan.json and plots/plan_*.png into RUN_DIR."),
    "plan check": ("plan", "Check a one-replica plan against runs through the router: predicted "
                   "vs measured SLO quantile per arm and routing policy, with the plan's own "
                   "settings."),
    "fleet-truth": ("plan", "The fleet plan against fleets of fake replicas of known capacity "
                    "behind the real vllm-router: one replica swept and planned, then each "
                    "fleet's true capacity measured from the planned N outward."),
    "kernels": ("kernels", "Measured device costs: micro-benchmarks, server probes, cost-model "
                "fits."),
    "faults": ("faults", "Inject every fault row into a real bench process; one table, exit 1 "
               "if any row did not survive."),
    "measure": ("measure", "Measure the suite's own parts: the streaming client's timing "
                "accuracy, redaction recall, the proxy scorer's cost."),
    "load": ("load", "Background load across hosts: locust master and workers, each worker's "
             "raw records merged into the run's requests.jsonl."),
}
STAGES: dict[str, tuple[str, ...]] = {}
for _word, (_stage, _) in COMMANDS.items():
    STAGES[_stage] = (*STAGES.get(_stage, ()), _word)


def build(stages: tuple[str, ...] = tuple(STAGES)) -> typer.Typer:
    """The command with the commands of `stages` (every stage by default)."""
    app = _new_app()
    if "serve" in stages:
        from compaction_bench.serve import cli as serve_cli

        _adopt(app, serve_cli.app)
    if "histories" in stages:
        from compaction_bench.histories import cli as histories_cli

        app.add_typer(histories_cli.app, name="histories")
        _adopt(app, histories_cli.app, only={"import-study"}, alias=False)
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


def index() -> typer.Typer:
    """The command as `--help` shows it: every word of `COMMANDS` with its line of help, no
    stage imported (a word given is run by `build` of its stage, never by this)."""
    app = _new_app()
    for word, (stage, line) in COMMANDS.items():
        def listed(stage: str = stage) -> None:
            run_cli(build((stage,)))

        app.command(word, help=line, add_help_option=False,
                    context_settings=PASS_THROUGH)(listed)
    return app


def reference() -> list[tuple[str, str, str]]:
    """(command, usage, first paragraph of help) for every command and subcommand of the built app,
    in the app's order: docs/commands.md's table is generated from this at build time, so the
    list of commands is written nowhere by hand."""
    rows: list[tuple[str, str, str]] = []

    def walk(command: Any, path: str, parent: Any) -> None:  # typer's own click classes
        ctx = command.context_class(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
        group = hasattr(command, "list_commands")
        if parent is not None:
            usage = "" if group else " ".join(command.collect_usage_pieces(ctx))
            first = (command.help or "").strip().split("\n\n")[0]  # the first paragraph
            rows.append((path, usage, " ".join(first.split())))
        if group:
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, f"{path} {name}", ctx)

    walk(typer.main.get_command(build()), "compaction-bench", None)
    return rows


def stage_of(argv: list[str]) -> str | None:
    """The stage whose module defines the command `argv` names (its first word that is not an
    option), or None: every stage is then built."""
    word = next((a for a in canonical(argv) if not a.startswith("-")), None)
    word = RENAMED.get(word or "", word)
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

    argv = canonical(sys.argv[1:])
    stage = stage_of(argv)
    run_cli(build((stage,)) if stage else index(), argv)
