"""The study's frozen prompts, one file each, selectable by name; see README.md for sources.

A prompt's identity is the sha256 of the exact text sent (the file without its final newline);
it goes into the provenance of every rewrite and every judge verdict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.common.errors import SuiteError

PROMPT_DIR = Path(__file__).parent
REWRITE_PROMPTS = ("telegraphic", "telegraphic-evidence", "telegraphic-evidence-a3")
JUDGE_PROMPTS = ("judge-a4",)


class PromptError(SuiteError):
    """A prompt name that is not shipped."""


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    sha256: str


def prompt_names() -> list[str]:
    """Every shipped prompt name, sorted."""
    return sorted(p.stem for p in PROMPT_DIR.glob("*.txt"))


def load_prompt(name: str) -> Prompt:
    """The frozen prompt `name`; an unknown name raises `PromptError` listing the known ones."""
    path = PROMPT_DIR / f"{name}.txt"
    if not path.is_file():
        raise PromptError(f"unknown prompt {name!r}; known: {', '.join(prompt_names())} "
                         f"(files in {PROMPT_DIR})")
    text = path.read_text(encoding="utf-8").removesuffix("\n")
    return Prompt(name=name, text=text, sha256=hashlib.sha256(text.encode()).hexdigest())
