"""The one command imports only the named command's stage (compaction_bench/cli.py): every
top-level word must belong to exactly one stage, or `compaction-bench <word>` would find no such
command when built alone."""

from __future__ import annotations

import typer

from compaction_bench.cli import STAGES, build, stage_of


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
