"""The one command imports only the named command's stage (compaction_bench/cli.py): every
top-level word must belong to exactly one stage, or `compaction-bench <word>` would find no such
command when built alone."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer

from compaction_bench.cli import COMMANDS, STAGES, build, index, stage_of


def words(app: typer.Typer) -> set[str]:
    commands = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "")
                for c in app.registered_commands}
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
    assert stage_of(["--version"]) is None
    assert stage_of(["nonsense"]) is None
    assert stage_of([]) is None


def _short_helps(app: typer.Typer) -> dict[str, str]:
    command: Any = typer.main.get_command(app)  # typer's own copy of click's Group
    ctx = command.context_class(command)
    return {name: found.get_short_help_str(limit=10_000)
            for name in command.list_commands(ctx)
            if (found := command.get_command(ctx, name)) is not None}


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
