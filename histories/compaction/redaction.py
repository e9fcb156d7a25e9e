"""Redaction of secrets before text leaves for an external compressor or judge.

The study's ethics section asks applications to redact secrets before external rewriting. Each
secret becomes a numbered placeholder; `restore` puts the originals back into what comes back, so
the local history keeps its own text while the external endpoint never sees the values. The
number of redactions is recorded per block.

What counts as a secret comes from a maintained rule set, not from a list of our own: every line
detector of the `detect-secrets` library (AWS, GitHub, GitLab, Slack, Stripe, JWT, private keys,
basic-auth URLs, ...), its keyword detector (password/secret/api_key assignments) and its Base64
entropy detector, with the library's own false-positive heuristics. `redaction_rules.toml` adds,
as data and each with its source, the shapes those detectors miss in free text (shell flags,
`mysql -pX`, `curl -u`, env assignments, longer token formats, PEM blocks without an END line).
`python -m compaction_bench.histories.compaction.redaction_bench` measures recall and false
positives on the
labelled corpus in `data/redaction/`.

Contract:
- `redact(text)` replaces every secret by `[REDACTED-SECRET-n]`; the same value gets the same n,
  numbered in order of first appearance; a detected value is also replaced where it recurs
  elsewhere in the text (8+ characters, at token boundaries). Text that already holds
  placeholder-shaped strings keeps them as they are.
- `restore(redacted_text, redacted)` puts the values back: `restore(redact(t).text, redact(t))`
  gives `t` exactly, for any `t` without placeholder-shaped strings.
- `scan(text)` is what `redact` replaces: non-overlapping findings in text order.
A false redaction costs one placeholder in a compressor's input; a missed one leaks a credential,
so where the detectors disagree the wider span wins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.filters import heuristic
from detect_secrets.plugins import keyword
from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

from compaction_bench.histories.compaction.redaction_rules import (
    RULES,
    RedactionRules,
    names_no_secret,
    value_passes,
)

PLACEHOLDER = "[REDACTED-SECRET-{n}]"
_PLACEHOLDER_RE = re.compile(r"\[REDACTED-SECRET-(\d+)\]")
REPEAT_MIN_CHARS = 8  # a found value is replaced where it recurs when at least this long


@dataclass(frozen=True)
class Finding:
    """One secret in a text: `text[start:end]`, the kind of secret and the detector that saw it
    (a detect-secrets plugin class, `keyword`, `entropy`, a rule id of ours, or `repeat`)."""

    start: int
    end: int
    kind: str
    detector: str


@dataclass(frozen=True)
class Redacted:
    """`text` with every secret replaced; `secrets[n - 1]` is what placeholder n stands for."""

    text: str
    secrets: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.secrets)


# --- detect-secrets' detectors --------------------------------------------------------------------

def _regex_detectors(rules: RedactionRules) -> list[RegexBasedDetector]:
    """Every regex detector detect-secrets ships, except the skipped ones (see the rules file)."""
    skip = set(rules.detect_secrets.skip)
    classes: list[type[BasePlugin]] = list(get_mapping_from_secret_type_to_class().values())
    found: list[RegexBasedDetector] = []
    for plugin in classes:
        if plugin.__name__ not in skip and issubclass(plugin, RegexBasedDetector):
            found.append(plugin())
    return sorted(found, key=lambda p: type(p).__name__)


def _keyword_regexes() -> list[tuple[re.Pattern[str], int]]:
    """The keyword detector's patterns for every file type it knows, with each value's group:
    free text may hold any of them (YAML, .env, Python, Go, C)."""
    seen: dict[re.Pattern[str], int] = {}
    tables = [keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
              keyword.CONFIG_DENYLIST_REGEX_TO_GROUP, *keyword.REGEX_BY_FILETYPE.values()]
    for table in tables:
        for regex, group in table.items():
            seen.setdefault(regex, group)
    return list(seen.items())


_DETECTORS = _regex_detectors(RULES)
_KEYWORD = _keyword_regexes()
_ENTROPY = Base64HighEntropyString(limit=RULES.detect_secrets.entropy_limit)
# '/' splits tokens (paths and model ids are words joined by it), '=' only pads a base64 tail
_ENTROPY_TOKEN = re.compile(r"[A-Za-z0-9+_-]+={0,2}")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=_-]*")
_TOKEN_CHAR = re.compile(r"[A-Za-z0-9_+/=-]")
_TAIL = re.compile(r"(?:[A-Za-z0-9_+/=-]|\.(?=[A-Za-z0-9_-]))*")
_EDGE = " \t\r\n\"'`=:@/,;"
_QUOTES = "\"'`"
# An unquoted value in free text ends at a space or at what separates fields (a=1;b=2, ?a=1&b=2).
_UNQUOTED_VALUE = re.compile(r"[^\s;,&|]+")


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(offset, line) of every line: detect-secrets' detectors are line detectors."""
    offset = 0
    for line in text.splitlines(keepends=True):
        yield offset, line
        offset += len(line)


def _strip_span(text: str, start: int, end: int, chars: str = _EDGE) -> tuple[int, int]:
    while start < end and text[start] in chars:
        start += 1
    while end > start and text[end - 1] in chars:
        end -= 1
    return start, end


def _detector_findings(line: str, base: int) -> Iterator[Finding]:
    """detect-secrets' regex detectors. A match's value is its first group where that group is
    the secret (8+ characters; some detectors' only group is the prefix, `ghp`), else the whole
    match, extended over the token characters that follow it: several detectors stop at a fixed
    length (Stripe's 24) and would leave a longer key's tail readable."""
    for plugin in _DETECTORS:
        name = type(plugin).__name__
        for regex in plugin.denylist:
            for match in regex.finditer(line):
                groups = [g for g in range(1, (regex.groups or 0) + 1) if match.group(g)]
                if groups and len(match.group(groups[0])) >= 8:
                    start, end = match.span(groups[0])
                else:
                    start, end = match.span()
                    if end > start and (_TOKEN_CHAR.match(line[end - 1]) or line[end - 1] == "."):
                        tail = _TAIL.match(line, end)  # JWT's lazy signature part, too
                        end = tail.end() if tail else end
                    if start > 0 and line[start - 1].isalnum() and line[start].isalnum():
                        continue  # a match inside a longer word is not a token
                start, end = _strip_span(line, start, end)
                while end > start and line[end - 1] == ".":
                    end -= 1
                if end > start and value_passes(line[start:end], filters=("sequential",)):
                    yield Finding(base + start, base + end, plugin.secret_type, name)


def _keyword_findings(line: str, base: int, rules: RedactionRules) -> Iterator[Finding]:
    """detect-secrets' keyword detector (password, secret, api_key, db_pass, ...). Its value
    pattern runs to the end of the line, right for a config file; in free text an unquoted value
    ends at the first space, and a plain word after a spaced separator is prose."""
    for regex, group in _KEYWORD:
        for match in regex.finditer(line):
            start, end = match.span(group)
            if end <= start:
                continue
            before = line[start - 1] if start > 0 else ""
            quoted = before in _QUOTES and line[end:end + 1] == before
            if not quoted:
                word = _UNQUOTED_VALUE.match(line, start, end)
                end = word.end() if word else start
                while end > start and line[end - 1] in ".,;:)]}":
                    end -= 1
            name = re.search(r"[\w.-]*$", line[:match.start()])
            tail = re.match(r"\w*", line[match.start():])
            full_name = (name.group(0) if name else "") + (tail.group(0) if tail else "")
            if names_no_secret(full_name, rules):
                continue
            if line[start:end] in (full_name, re.split(r"[_.\-]", full_name)[-1]):
                continue  # `api_key=api_key`: a keyword argument passed through
            operator = line[match.start():start]
            if not quoted and ("==" in operator or "!=" in operator):
                continue  # `if password == confirm_password`: code comparing two names
            value = line[start:end]
            if len(value) < 2 or (len(value) > 1 and heuristic.is_templated_secret(value)):
                continue
            if value_passes(value, filters=("reference", "prose", "sequential"), quoted=quoted,
                            spaced=before.isspace(), rules=rules):
                yield Finding(base + start, base + end, "password-or-key", "keyword")


def _entropy_limit(length: int, rules: RedactionRules) -> float:
    """The plugin's limit for 32+ characters, the same share of the maximum below (see rules)."""
    limit = rules.detect_secrets.entropy_limit
    return limit * min(1.0, math.log2(length) / 5.0)


def _entropy_findings(line: str, base: int, rules: RedactionRules) -> Iterator[Finding]:
    """detect-secrets' Base64 entropy measure on unquoted tokens of free text, kept to long
    random-looking alphanumeric runs with digits and both cases (see the rules file)."""
    spec = rules.detect_secrets
    public = []  # (start, end) of each prefix named in entropy_skip_after and the base64 after it
    if rules.entropy_skip_after is not None:
        for prefix in rules.entropy_skip_after.finditer(line):
            blob = _BASE64_RUN.match(line, prefix.end())
            public.append((prefix.start(), blob.end() if blob else prefix.end()))
    for match in _ENTROPY_TOKEN.finditer(line):
        start, end = _strip_span(line, match.start(), match.end(), "_-")
        token = line[start:end].rstrip("=")
        if len(token) < spec.entropy_min_length:
            continue
        if max(len(run) for run in _ALNUM_RUN.findall(token) or [""]) < spec.entropy_min_run:
            continue
        if not value_passes(token, filters=("sequential",), needs=("digit", "upper", "lower")):
            continue
        if heuristic.is_potential_uuid(token):
            continue
        if any(s < end and start < e for s, e in public):
            continue  # a public key, an integrity hash: base64 that is public by its format
        if _ENTROPY.calculate_shannon_entropy(token) > _entropy_limit(len(token), rules):
            yield Finding(base + start, base + start + len(token), "high-entropy", "entropy")


def _rule_findings(text: str, rules: RedactionRules) -> Iterator[Finding]:
    """Our rules, on the whole text (a PEM block spans lines)."""
    for rule in rules.rules:
        spec = rule.spec
        has_value = "value" in rule.regex.groupindex
        for match in rule.regex.finditer(text):
            start, end = match.span("value") if has_value else match.span()
            quoted = end - start >= 2 and text[start] in _QUOTES and text[end - 1] == text[start]
            if has_value and quoted:
                start, end = start + 1, end - 1
            if end <= start:
                continue
            if "name" in rule.regex.groupindex and names_no_secret(match.group("name") or "",
                                                                   rules):
                continue
            if value_passes(text[start:end], filters=spec.filters, needs=spec.needs, rules=rules):
                yield Finding(start, end, spec.kind, spec.id)


def _merged(findings: list[Finding]) -> list[Finding]:
    """Overlapping findings become one span (the widest extent wins); the first kind stays."""
    out: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.start, -f.end)):
        if out and f.start < out[-1].end:
            last = out[-1]
            out[-1] = Finding(last.start, max(last.end, f.end), last.kind, last.detector)
        else:
            out.append(f)
    return out


def _repeats(text: str, findings: list[Finding]) -> list[Finding]:
    """Where a found value recurs elsewhere (an echoed password), those places too."""
    extra = []
    for value in {text[f.start:f.end] for f in findings if f.end - f.start >= REPEAT_MIN_CHARS}:
        for match in re.finditer(re.escape(value), text):
            start, end = match.span()
            if (start > 0 and value[0].isalnum() and text[start - 1].isalnum()) or (
                    end < len(text) and value[-1].isalnum() and text[end].isalnum()):
                continue
            extra.append(Finding(start, end, "repeat", "repeat"))
    return extra


def scan(text: str, rules: RedactionRules = RULES) -> list[Finding]:
    """Every secret in `text`, as non-overlapping findings in text order (see the module)."""
    found: list[Finding] = list(_rule_findings(text, rules))
    for base, line in _lines(text):
        found.extend(_detector_findings(line, base))
        found.extend(_keyword_findings(line, base, rules))
        found.extend(_entropy_findings(line, base, rules))
    kept = [f for f in found if not _inside_placeholder(text, f)]
    merged = _merged(kept)
    return _merged(merged + _repeats(text, merged))


def _inside_placeholder(text: str, finding: Finding) -> bool:
    return any(m.start() < finding.end and finding.start < m.end()
               for m in _PLACEHOLDER_RE.finditer(text, max(0, finding.start - 24),
                                                 min(len(text), finding.end + 24)))


def redact(text: str) -> Redacted:
    """Replace every secret by a numbered placeholder (the same value, the same one)."""
    secrets: list[str] = []
    numbers: dict[str, int] = {}
    parts: list[str] = []
    position = 0
    for finding in scan(text):
        value = text[finding.start:finding.end]
        if value not in numbers:
            secrets.append(value)
            numbers[value] = len(secrets)
        parts += [text[position:finding.start], PLACEHOLDER.format(n=numbers[value])]
        position = finding.end
    parts.append(text[position:])
    return Redacted(text="".join(parts), secrets=tuple(secrets))


def restore(text: str, redacted: Redacted) -> tuple[str, int]:
    """Put the original values back where their placeholders came back; (text, how many)."""
    restored = 0

    def back(m: re.Match[str]) -> str:
        nonlocal restored
        n = int(m.group(1))
        if 1 <= n <= len(redacted.secrets):
            restored += 1
            return redacted.secrets[n - 1]
        return m.group(0)

    return _PLACEHOLDER_RE.sub(back, text), restored
