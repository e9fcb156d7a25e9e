"""The rules file that completes detect-secrets' detectors (`redaction_rules.toml`), typed and
compiled, and the checks that tell a secret's value from a name, a reference or a prose word.

Contract: `load_rules(path)` validates the whole file (unknown keys, bad regexes, unknown filter
or class names) and refuses with `RedactionRulesError` naming the file, the rule and the field.
`RULES` is the shipped file, loaded at import, so a broken rules file fails the first import
rather than the first redaction. `value_passes(value, ...)` is the one gate every candidate value
goes through.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from detect_secrets.filters import heuristic
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from compaction_bench.common.errors import SuiteError, describe_validation

RULES_FILE = Path(__file__).parent / "redaction_rules.toml"
Filter = Literal["reference", "prose", "sequential"]
CharClass = Literal["digit", "letter", "upper", "lower"]


class RedactionRulesError(SuiteError):
    """The redaction rules file is unreadable or invalid; the message names file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleSpec(_Strict):
    """One rule of the file (see its header for the fields)."""

    id: str
    kind: str
    source: str = Field(min_length=1, description="where the token format is documented")
    pattern: str
    needs: tuple[CharClass, ...] = ()
    filters: tuple[Filter, ...] = ()

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return pattern


class DetectSecretsSpec(_Strict):
    """Which detect-secrets plugins run, and the entropy detector's limits."""

    skip: tuple[str, ...] = ()
    entropy_limit: float = Field(gt=0, le=6)
    entropy_min_length: int = Field(gt=0)
    entropy_min_run: int = Field(gt=0)
    entropy_skip_after: tuple[str, ...] = ()

    @field_validator("entropy_skip_after")
    @classmethod
    def _all_compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
        return patterns


class FilterSpec(_Strict):
    placeholders: tuple[str, ...] = ()
    ignore_names: tuple[str, ...] = ()
    name_suffixes: tuple[str, ...] = ()


class RulesFile(_Strict):
    detect_secrets: DetectSecretsSpec
    filters: FilterSpec
    rule: tuple[RuleSpec, ...]


@dataclass(frozen=True)
class Rule:
    """A compiled rule."""

    spec: RuleSpec
    regex: re.Pattern[str]


@dataclass(frozen=True)
class RedactionRules:
    """The loaded file: its compiled rules and the filter lists."""

    path: Path
    detect_secrets: DetectSecretsSpec
    placeholders: frozenset[str]
    ignore_names: frozenset[str]
    name_suffixes: frozenset[str]
    rules: tuple[Rule, ...]
    entropy_skip_after: re.Pattern[str] | None = None  # prefixes of public base64


def load_rules(path: Path = RULES_FILE) -> RedactionRules:
    """Read and validate a rules file; every refusal is a `RedactionRulesError` naming it."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RedactionRulesError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise RedactionRulesError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RedactionRulesError(f"{path}: not valid TOML: {exc}") from None
    try:
        parsed = RulesFile.model_validate(data)
    except ValidationError as exc:
        raise RedactionRulesError(f"{path}: {describe_validation(exc)}") from None
    ids = [r.id for r in parsed.rule]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise RedactionRulesError(f"{path}: rule ids must be unique, repeated: "
                                  f"{', '.join(duplicated)}")
    return RedactionRules(
        path=path, detect_secrets=parsed.detect_secrets,
        placeholders=frozenset(p.lower() for p in parsed.filters.placeholders),
        ignore_names=frozenset(n.upper() for n in parsed.filters.ignore_names),
        name_suffixes=frozenset(n.lower() for n in parsed.filters.name_suffixes),
        rules=tuple(Rule(spec, re.compile(spec.pattern)) for spec in parsed.rule),
        entropy_skip_after=re.compile("|".join(parsed.detect_secrets.entropy_skip_after))
        if parsed.detect_secrets.entropy_skip_after else None)


RULES = load_rules()

# --- the value checks ---------------------------------------------------------------------------

# detect-secrets' is_indirect_reference, applied to the value alone: `secret = get_secret()` or
# `password = request.form["password"]` name where a secret comes from, they do not hold one.
_CALL_OR_SUBSCRIPT = re.compile(r"^[\w.-]+[\[(]")
# args.password, self.token, settings.SECRET_KEY (a JWT's long dotted parts are not names)
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w{0,30}(?:\.[A-Za-z_]\w{0,30})+$")
_PATH = re.compile(r"^(?:~|\.{1,2})?/[\w.~/-]*$")  # KEY_FILE=/run/secrets/db, ./id_rsa
_PROSE_WORD = re.compile(r"^(?:[a-z]+|[A-Z][a-z]+)$")
_CLASSES = {
    "digit": str.isdigit, "letter": str.isalpha, "upper": str.isupper, "lower": str.islower,
}


def names_no_secret(name: str, rules: RedactionRules = RULES) -> bool:
    """Whether a variable name describes a secret instead of holding one: an ignored name (PWD)
    or one whose last part is a listed suffix (secret_name, password_hash, KEY_LENGTH)."""
    last = re.split(r"[_.\-]", name)[-1].lower() if name else ""
    return name.upper() in rules.ignore_names or last in rules.name_suffixes


def has_classes(value: str, needs: tuple[str, ...]) -> bool:
    """Whether `value` holds at least one character of each class in `needs`."""
    return all(any(_CLASSES[c](ch) for ch in value) for c in needs)


def is_reference(value: str, rules: RedactionRules = RULES) -> bool:
    """A value that names or points at a secret rather than holding one: a placeholder word, a
    shell or template variable, a call, an attribute, a path."""
    if value.lower() in rules.placeholders:
        return True
    if len(value) > 1 and heuristic.is_templated_secret(value):  # {x}, <x>, ${x}
        return True
    if heuristic.is_prefixed_with_dollar_sign(value) or value.startswith("%"):
        return True
    return bool(_CALL_OR_SUBSCRIPT.match(value) or _DOTTED_NAME.match(value)
                or _PATH.match(value))


def is_prose(value: str, *, quoted: bool, spaced: bool) -> bool:
    """An unquoted plain word after a spaced separator: `password: must contain a digit`."""
    return not quoted and spaced and bool(_PROSE_WORD.match(value))


def value_passes(value: str, *, filters: tuple[str, ...] = (), needs: tuple[str, ...] = (),
                 quoted: bool = False, spaced: bool = False,
                 rules: RedactionRules = RULES) -> bool:
    """The gate for every candidate: values without a letter or digit and short counts never
    pass; then the `filters` ("sequential": detect-secrets' sequential-string check, which our
    context rules leave out: anything after `Authorization: Bearer` is a credential) and the
    `needs`."""
    if not value.strip():
        return False
    # A short value is a substring of detect-secrets' sequences by chance (any single letter
    # is), so the check applies from 8 characters on.
    if "sequential" in filters and len(value) >= 8 and heuristic.is_sequential_string(value):
        return False
    if not any(ch.isalnum() for ch in value):  # `*****`, `---`: not a secret
        return False
    if value.isdigit() and len(value) < 4:  # a count, a length, a flag: PASSES=3, KEY_LEN=32
        return False
    if needs and not has_classes(value, needs):
        return False
    if "reference" in filters and is_reference(value, rules):
        return False
    return not ("prose" in filters and is_prose(value, quoted=quoted, spaced=spaced))
