"""Redaction of secret-looking values before text leaves for an external compressor or judge.

The study's ethics section asks applications to redact secrets before external rewriting. Each
secret becomes a numbered placeholder; `restore` puts the originals back into what comes back, so
the local history keeps its own text while the external endpoint never sees the values. The
number of redactions is recorded per block. The patterns are deliberately broad (a false
redaction costs one placeholder; a missed one leaks a credential).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLACEHOLDER = "[REDACTED-SECRET-{n}]"
_PLACEHOLDER_RE = re.compile(r"\[REDACTED-SECRET-(\d+)\]")

# Whole-match secrets: the entire match is replaced.
_WHOLE = [
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----",
               re.DOTALL),
    re.compile(r"\b(?:sk|rk|pk)-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}"),  # OpenAI, Stripe..
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),  # Slack
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),  # Google API keys
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),  # Hugging Face
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"),  # JWT
]
# Value secrets: only group "value" is replaced (the name stays readable).
_VALUED = [
    # env-style or config-style assignments whose name ends in a secret word:
    # API_KEY=..., DB_PASSWORD: ..., "client_secret": "...", export GITHUB_TOKEN=...
    re.compile(
        r"(?i)\b[\w.-]*?(?:api[_-]?key|access[_-]?key|secret(?:[_-]?key)?|private[_-]?key|"
        r"token|passw(?:or)?d|passwd|pwd|credentials?)[\"']?\s*[:=]\s*[\"']?"
        r"(?P<value>[^\s\"',;]{3,})"),
    re.compile(r"(?i)\b(?:bearer|basic)\s+(?P<value>[A-Za-z0-9._~+/=-]{12,})"),
    re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s:/@]+:(?P<value>[^\s@/]{3,})@"),  # URL password
]


@dataclass(frozen=True)
class Redacted:
    """`text` with every secret replaced; `secrets[n - 1]` is what placeholder n stands for."""

    text: str
    secrets: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.secrets)


def redact(text: str) -> Redacted:
    """Replace secret-looking values by numbered placeholders (the same value, the same one)."""
    secrets: list[str] = []

    def placeholder(value: str) -> str:
        if value not in secrets:
            secrets.append(value)
        return PLACEHOLDER.format(n=secrets.index(value) + 1)

    for pattern in _WHOLE:
        text = pattern.sub(lambda m: placeholder(m.group(0)), text)
    for pattern in _VALUED:
        def value_only(m: re.Match[str]) -> str:
            if _PLACEHOLDER_RE.fullmatch(m.group("value")):
                return m.group(0)
            start, end = m.span("value")
            whole = m.group(0)
            base = m.start()
            return whole[: start - base] + placeholder(m.group("value")) + whole[end - base:]
        text = pattern.sub(value_only, text)
    return Redacted(text=text, secrets=tuple(secrets))


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
