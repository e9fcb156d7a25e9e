"""Lexical fidelity checks of a rewrite: which numbers and identifiers of a raw reasoning block
are missing from its record.

Two uses, one extraction:
- diagnostics (recorded for every rewritten block, Appendix D.1): every number and every
  identifier-looking token of the raw block that the record lacks;
- required fields (Appendix A.3's repair trigger): candidate identifiers (option-style ids such
  as V2, VAX-28) and hard-threshold values (a number right after a comparator: <=, >=, at most,
  minimum, ...). A draft missing one gets one repair request.

These are mechanical checks. They catch a dropped `risk <= 0.05`; they cannot tell whether a
kept number still means what it meant (the fidelity judge in `checks.py` is for that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?![\w])")
_COMPARATOR = (r"<=|>=|=<|=>|<|>|≤|≥|==|\bat most\b|\bat least\b|\bno more than\b|"
               r"\bno less than\b|\bno fewer than\b|\bbelow\b|\babove\b|\bunder\b|\bover\b|"
               r"\bexceeds?\b|\bminimum(?: of)?\b|\bmaximum(?: of)?\b|\bmin\b|\bmax\b|\blte\b|"
               r"\bgte\b|\bup to\b")
_THRESHOLD_RE = re.compile(rf"(?i)(?:{_COMPARATOR})\s*[$€£]?\s*(?P<n>{_NUMBER})(?![\w])")
_CANDIDATE_RE = re.compile(r"\b[A-Z][A-Z0-9]{0,7}-?\d+[A-Za-z]?\b")
_WORDISH_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[./:-][A-Za-z0-9_]+)*")
_BACKTICK_RE = re.compile(r"`([^`\n]{1,80})`")
_CAMEL_RE = re.compile(r"[a-z][A-Z]")


def count_words(text: str) -> int:
    """Words as the study counts them: whitespace-separated tokens."""
    return len(text.split())


def numbers(text: str) -> set[str]:
    """Every number in `text`, normalized (thousands separators removed). Digits inside
    identifiers (V2, risk_lte2) are identifiers' business, not numbers."""
    return {m.group(0).replace(",", "") for m in _NUMBER_RE.finditer(text)}


def identifiers(text: str) -> set[str]:
    """Identifier-looking tokens: with a digit, an underscore, camelCase, or a path/dotted form
    (stats_utils.py, VAX-28, simulate_vaccine_options, getMedian), plus `backticked` spans."""
    found = {m.group(1).strip() for m in _BACKTICK_RE.finditer(text)}
    for m in _WORDISH_RE.finditer(text):
        token = m.group(0).rstrip(".:-")
        if (any(c.isdigit() for c in token) or "_" in token or _CAMEL_RE.search(token)
                or re.search(r"[A-Za-z0-9][./][A-Za-z_]", token)):
            found.add(token)
    return {t for t in found if t}


def required_fields(text: str) -> list[str]:
    """Candidate identifiers and hard-threshold values of a raw block, in order of appearance."""
    seen: dict[str, None] = {}
    for m in _CANDIDATE_RE.finditer(text):
        seen.setdefault(m.group(0), None)
    for m in _THRESHOLD_RE.finditer(text):
        seen.setdefault(m.group("n").replace(",", ""), None)
    return list(seen)


def _present(field: str, record: str, record_numbers: set[str]) -> bool:
    if re.fullmatch(_NUMBER, field):
        return field.replace(",", "") in record_numbers or field in record
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(field)}(?![A-Za-z0-9_])", record) is not None


def missing_required(raw: str, record: str) -> list[str]:
    """The raw block's required fields that `record` does not contain."""
    record_numbers = numbers(record)
    return [f for f in required_fields(raw) if not _present(f, record, record_numbers)]


@dataclass(frozen=True)
class LexicalDiagnostics:
    """What a record lacks of its raw block. Empty lists: nothing lexically missing."""

    missing_numbers: list[str]
    missing_identifiers: list[str]
    missing_required: list[str]

    @property
    def clean(self) -> bool:
        return not (self.missing_numbers or self.missing_identifiers or self.missing_required)


def lexical_diagnostics(raw: str, record: str) -> LexicalDiagnostics:
    """Numbers and identifiers of `raw` missing from `record` (sorted), and missing required
    fields (in order of appearance)."""
    record_numbers = numbers(record)
    return LexicalDiagnostics(
        missing_numbers=sorted(n for n in numbers(raw) if not _present(n, record, record_numbers)),
        missing_identifiers=sorted(i for i in identifiers(raw)
                                   if not _present(i, record, record_numbers)),
        missing_required=missing_required(raw, record))
