"""The one command imports only the named command's stage (compaction_bench/cli.py): every
top-level word must belong to exactly one stage, or `compaction-bench <word>` would find no such
command when built alone."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer

from compaction_bench.cli import COMMANDS, GROUPED, STAGES, build, canonical, index, stage_of


def words(app: typer.Typer) -> set[str]:
    commands = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "")
                for c in app.registered_commands if not c.hidden}
    groups = {g.name or "" for g in app.registered_groups}
    return commands | groups


def test_every_command_is_in_exactly_one_stage_and_each_stage_builds_its_own() -> None:
    listed = [w for stage in STAGES.values() for w in stage]
    assert len(listed) == len(set(listed)), listed
    assert words(build()) == set(listed)
    for stage, stage_words in STAGES.items():
        assert words(build((stage,))) == set(stage_words), stage


def test_the_first_word_that_is_not_an_option_picks_the_stage() -> None:
    assert stage_of(["bench", "blocks=3"]) == "bench"
    assert stage_of(["plan-check", "--plan", "x"]) == "plan"
    assert stage_of(["histories", "import", "f"]) == "histories"
    assert stage_of(["plan", "check", "x"]) == "plan" and stage_of(["plan", "x"]) == "plan"
    assert stage_of(["serve", "check"]) == "serve" and stage_of(["check"]) == "serve"
    assert stage_of(["study", "import"]) == "histories"
    assert stage_of(["study", "report"]) == "bench" and stage_of(["report-study"]) == "bench"
    assert stage_of(["--version"]) is None
    assert stage_of(["nonsense"]) is None
    assert stage_of([]) is None


def _short_helps(app: typer.Typer) -> dict[str, str]:
    command: Any = typer.main.get_command(app)  # typer's own copy of click's Group
    ctx = command.context_class(command)
    return {name: found.get_short_help_str(limit=10_000)
            for name in command.list_commands(ctx)
            if (found := command.get_command(ctx, name)) is not None and not found.hidden}


def test_the_help_index_lists_every_command_with_the_commands_own_line() -> None:
    # `compaction-bench --help` builds the index, which imports no stage: its lines must be
    # the commands' own, or the help would drift from what each command says of itself
    listed = _short_helps(index())
    assert listed == _short_helps(build())
    assert list(listed) == list(COMMANDS)


@pytest.mark.e2e
def test_help_imports_no_stage() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv = ['compaction-bench', '--help']\n"
         "from compaction_bench.cli import entry\ntry:\n    entry()\nexcept SystemExit:\n"
         "    pass\nprint(sorted(m for m in sys.modules if m.startswith('compaction_bench.')))"],
        capture_output=True, text=True, timeout=120, check=True)
    imported = done.stdout.strip().splitlines()[-1]
    assert "fleet-truth" in done.stdout and "compaction_bench.cli" in imported
    assert not any(f"compaction_bench.{stage}" in imported
                   for stage in ("serve", "histories", "bench", "plan", "kernels", "loadgen")
                   ), imported


def test_grouped_spellings_run_their_command_and_a_folder_named_check_is_still_a_folder() -> None:
    # issue 31: commands grouped as vLLM groups its own; only the first two words are read
    assert canonical(["plan", "check", "results/a", "results/b", "replicas=2"]) == [
        "plan check", "results/a", "results/b", "replicas=2"]
    assert canonical(["serve", "check", "port=8100"]) == ["serve check", "port=8100"]
    assert canonical(["plan", "./check"]) == ["plan", "./check"]
    assert canonical(["serve", "port=8100", "check"]) == ["serve", "port=8100", "check"]
    assert canonical(["histories", "import", "check"]) == ["histories", "import", "check"]
    assert {" ".join(words) for words in GROUPED} <= set(COMMANDS)


@pytest.mark.parametrize("argv", [["study"], ["study", "export"], ["study", "--help"]])
def test_study_without_its_subcommand_is_refused_in_one_line(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        canonical(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "study import" in err and "study report" in err, err


def test_an_old_flat_name_still_runs_its_command_and_says_which_spelling_to_use() -> None:
    from typer.testing import CliRunner

    app = build(("serve",))
    old = CliRunner().invoke(app, ["check", "--port", "1"], env={"MAKEFLAGS": None})
    new = CliRunner().invoke(app, [*canonical(["serve", "check"]), "--port", "1"],
                             env={"MAKEFLAGS": None})
    assert "Use `compaction-bench serve check`; `check` goes in 0.2.0." in old.stderr
    assert "deprecated" not in new.stderr
    # both ran the self-check itself: no server answers on port 1
    assert type(old.exception) is type(new.exception) and "127.0.0.1:1" in str(new.exception)
