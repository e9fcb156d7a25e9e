"""The options every command with settings has, written once: `name=value` words, `--config`
(a TOML file), `--from-env` (what its make target uses) and `--settings` (list them), and the
one call that resolves them (`settings_from`, over common/settings.py's `configure`).

A command's flags that users know (`serve --port`) are aliases of its settings' fields: pass the
given ones (not None) as `flags`, and they override every other layer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from compaction_bench.common.settings import configure, settings_lines, settings_of

M = TypeVar("M", bound=BaseModel)


def words_help(example: str) -> str:
    return (f"settings as name=value ({example}); the names are listed by --settings, each "
            "also a make variable in upper case")


ConfigFile = Annotated[Path | None, typer.Option(
    "--config", help="a TOML file of settings; words and flags given too override it")]
FromEnv = Annotated[bool, typer.Option(
    "--from-env", help="also take settings from the environment: their make names where given "
    "on make's command line (what the make target uses), COMPBENCH_<NAME> anywhere")]
ShowSettings = Annotated[bool, typer.Option(
    "--settings", help="list every setting with its make variable and default, and exit")]


def alias(field: str, *names: str) -> Any:
    """A flag users know, as an alias of a setting (None when not given)."""
    return typer.Option(*names, help=f"alias of {field}=", show_default=False)


def split_words(args: list[str] | None) -> tuple[list[str], list[str]]:
    """A command's trailing arguments split into (paths, `name=value` words), for commands
    whose positional paths come first (`plan-check PLAN RUN... replicas=2`); a word's name is
    an identifier, so a path with `=` in it stays a path unless its part before `=` is one."""
    paths: list[str] = []
    words: list[str] = []
    for arg in args or []:
        name, equals, _ = arg.partition("=")
        (words if equals and name.isidentifier() else paths).append(arg)
    return paths, words


def show_settings(model: type[BaseModel]) -> None:
    """`--settings`: one line per setting, its make variable, default and meaning."""
    typer.echo("\n".join(settings_lines(model)))


def settings_from(model: type[M], what: str, *, words: list[str] | None,
                  file: Path | None = None, from_env: bool = False,
                  flags: Mapping[str, Any] | None = None,
                  given: Mapping[str, Any] | None = None) -> M:
    """The command's settings: defaults, the file, the environment (with `from_env`), the
    words, then the flags given and what the command's arguments fix (`given`). `flags` is the
    command's own parameters (typer's `ctx.params`): those named like a setting and given (not
    None) are read as words after the others, so they win; the rest are left alone. An
    environment variable present but not taken is said on stderr, in one line each."""
    names = {setting.key for setting in settings_of(model)}
    flag_words = [f"{name}={value}" for name, value in (flags or {}).items()
                  if name in names and value is not None]
    return configure(model, what, file=file, env=os.environ if from_env else None,
                     words=[*(words or []), *flag_words], given=given,
                     say=lambda line: typer.echo(line, err=True))
