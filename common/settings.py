"""Typed settings from layers: the model's defaults, a TOML file, environment variables named
like make variables, and `key=value` words, each later layer overriding the earlier ones.

The environment layer (`--from-env`, what `make bench` uses) takes a setting's make name
(`SEED`) only where it was given on make's own command line (`make bench SEED=3`: GNU make
lists those in MAKEFLAGS), and its prefixed name (`COMPBENCH_SEED=3`) anywhere. So a variable a
platform sets for its own use (PORT, SEED, TASK, SOURCE) never changes a run; one that is
present but not taken is named in `Layers.ignored`, which the command prints.

A setting is declared once, as a field of a pydantic model; its other names follow from the
field's name: `stream_deadline_s` is `STREAM_DEADLINE_S` in the environment (what `make bench
STREAM_DEADLINE_S=60` passes), `stream_deadline_s = 60` in the file and `stream_deadline_s=60`
(or `STREAM_DEADLINE_S=60`) on the command line. A nested model's fields are `<section>.<field>`
in words (`sweep.levels=1,2,4`), a `[sweep]` table in the file and `SWEEP_LEVELS` in the
environment. Text for a tuple field is split at commas (`arms=clean,self`); an empty value
leaves the setting unset. Every unknown name, unreadable file or bad value is refused in one
line naming where it came from.
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from compaction_bench.common.errors import SuiteError, describe_validation

M = TypeVar("M", bound=BaseModel)


ENV_PREFIX = "COMPBENCH_"  # COMPBENCH_<MAKE NAME>: a setting from the environment, always taken


class SettingsError(SuiteError):
    """A settings file, variable or word that cannot be used; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One setting of a model, with its three spellings."""

    path: tuple[str, ...]  # ("sweep", "levels")
    annotation: Any
    default: Any
    description: str

    @property
    def key(self) -> str:
        """`sweep.levels`: the word and (as a table path) the file's name for it."""
        return ".".join(self.path)

    @property
    def variable(self) -> str:
        """`SWEEP_LEVELS`: the environment's (and make's) name for it."""
        return "_".join(self.path).upper()


def settings_of(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[Setting]:
    """Every setting of `model`, nested models' fields included, in declaration order."""
    for name, info in model.model_fields.items():
        nested = _model_in(info.annotation)
        if nested is not None:
            yield from settings_of(nested, (*prefix, name))
            continue
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        yield Setting((*prefix, name), info.annotation, default, info.description or "")


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _is_tuple(annotation: Any) -> bool:
    """A tuple field, also under `| None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_tuple(arg) for arg in typing.get_args(annotation))
    return annotation is tuple or typing.get_origin(annotation) is tuple


@dataclass
class Layers:
    """The merged settings and where each came from (the manifest keeps both)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # one line per variable not taken

    def put(self, setting: Setting, value: Any, source: str) -> None:
        if isinstance(value, str):
            value = value.strip()
            if value == "":
                return  # `make bench BLOCKS=` means: not given
            if _is_tuple(setting.annotation):
                value = tuple(part.strip() for part in value.split(",") if part.strip())
        target = self.values
        for part in setting.path[:-1]:
            target = target.setdefault(part, {})
        target[setting.path[-1]] = value
        self.sources[setting.key] = source


def read_settings_file(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The TOML file's table, refused in one line when it is missing or not TOML."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise SettingsError(f"{path}: no such settings file") from None
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML ({exc}); see `--settings` for the "
                            "names") from None


def layered(model: type[BaseModel], *, file: Path | None = None,
            env: Mapping[str, str] | None = None, words: Sequence[str] = ()) -> Layers:
    """Merge the layers (see the module docstring); nothing is validated yet."""
    settings = {s.key: s for s in settings_of(model)}
    by_variable = {s.variable: s for s in settings.values()}
    layers = Layers()
    if file is not None:
        for key, value in _flatten(read_settings_file(file, model)):
            if key not in settings:
                raise SettingsError(f"{file}: unknown setting '{key}'; known: "
                                    f"{', '.join(settings)}")
            layers.put(settings[key], value, f"file {file}")
    if env is not None:
        given = make_command_line(env)
        for variable, setting in by_variable.items():
            prefixed = ENV_PREFIX + variable
            if prefixed in env:
                layers.put(setting, env[prefixed], f"environment {prefixed}")
            elif variable in given and variable in env:
                layers.put(setting, env[variable], f"make {variable}")
            elif env.get(variable, "").strip():
                layers.ignored.append(
                    f"environment {variable}={env[variable].strip()!r} ignored: not given on "
                    f"make's command line; give it there ({variable}=...) or as {prefixed}")
    for word in words:
        name, sep, value = word.partition("=")
        named = settings.get(name.strip().lower()) or by_variable.get(name.strip().upper())
        if not sep or named is None:
            raise SettingsError(f"'{word}': give settings as name=value with one of "
                                f"{', '.join(settings)} (or its upper-case make name)")
        layers.put(named, value, "command line")
    return layers


def make_command_line(env: Mapping[str, str]) -> frozenset[str]:
    """The names of the variables given on make's command line (`make bench SEED=3`), which GNU
    make passes to its recipes in MAKEFLAGS after `--` (values escaped, names plain)."""
    flags = " " + env.get("MAKEFLAGS", "")
    if " -- " not in flags:
        return frozenset()
    words = re.split(r"(?<!\\) ", flags.split(" -- ", 1)[1])
    return frozenset(w.split("=", 1)[0] for w in words if "=" in w)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def build(model: type[M], layers: Layers, what: str) -> M:
    """Validate the merged layers; a bad value is refused naming its setting and source."""
    try:
        return model.model_validate(layers.values)
    except ValidationError as exc:
        sources = sorted({layers.sources.get(".".join(str(p) for p in err["loc"][:2]), "")
                          for err in exc.errors()} - {""})
        where = f" (from {'; '.join(sources)})" if sources else ""
        raise SettingsError(describe_validation(exc).replace(
            f"invalid {exc.title}", f"invalid {what}", 1) + where) from None


def settings_table(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(name, make variable, default, description) for every setting: `--settings` and the
    docs' configuration page print this, so the names are written nowhere by hand."""
    rows = []
    for setting in settings_of(model):
        default = setting.default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else (
            "" if default is None else str(default))
        rows.append((setting.key, setting.variable, shown, " ".join(setting.description.split())))
    return rows


def settings_lines(model: type[BaseModel]) -> list[str]:
    """`--settings` of a command: one aligned line per setting (`settings_table`)."""
    rows = settings_table(model)
    width = max(len(name) for name, *_ in rows)
    return [f"{name:<{width}}  {variable:<24} {default or '-':<18} {description}"
            for name, variable, default, description in rows]


def configure(model: type[M], what: str, *, file: Path | None = None,
              env: Mapping[str, str] | None = None, words: Sequence[str] = (),
              given: Mapping[str, Any] | None = None,
              say: Callable[[str], None] = lambda line: None) -> M:
    """A command's settings: `layered`, then `given` (values the command's own arguments fix),
    then `build`; `say` gets each environment variable that was present and not taken."""
    layers = layered(model, file=file, env=env, words=words)
    for line in layers.ignored:
        say(f"[{what}] {line}")
    layers.values.update(given or {})
    return build(model, layers, f"{what} settings")
