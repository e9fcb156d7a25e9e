"""How well does redaction work? Recall and false positives on the labelled corpus.

    python -m compaction_bench.histories.compaction.redaction_bench        # `make bench-redaction`

The corpus (`data/redaction/corpus.jsonl`, see its README) holds texts with the exact secret
substrings each contains, and look-alikes that contain none (reasoning prose, hashes, UUIDs,
paths, versions, model ids, code that names secrets without holding them).

- recall, per kind and overall: secrets found / secrets present. A secret is found when one of its
  occurrences lies wholly inside one redacted span and every occurrence of it that stands as a
  token of its own (not inside a longer word) does: a password redacted only in part, or once of
  twice, is not found.
- false-positive rate: look-alike texts with any redaction / look-alike texts.
- over-redaction: texts with a secret where something other than a labelled secret was redacted
  too / texts with a secret.
- time: median microseconds per `redact` call over the corpus texts, of `--repeat` passes.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.common.errors import SuiteError, run_cli
from compaction_bench.common.paths import data_root
from compaction_bench.histories.compaction.redaction import Finding, redact, scan


class CorpusError(SuiteError):
    """The corpus file is missing or a line is malformed; the message names file, line, field."""


SPLITS = ("dev", "holdout-1", "holdout-2")


@dataclass(frozen=True)
class CorpusEntry:
    """`split`: "dev" entries were used while writing the rules, "holdout" ones were written
    after the rules were frozen and measure how the rules carry over to texts they did not see."""

    id: str
    kind: str
    text: str
    secrets: tuple[str, ...]
    split: str

    @property
    def lookalike(self) -> bool:
        return not self.secrets


@dataclass
class Scores:
    """What `evaluate` measured. `recall` maps a kind to (found, present)."""

    recall: dict[str, tuple[int, int]] = field(default_factory=dict)
    lookalikes: int = 0
    false_positives: list[tuple[str, str]] = field(default_factory=list)  # (id, redacted value)
    misses: list[tuple[str, str]] = field(default_factory=list)  # (id, secret)
    secret_texts: int = 0
    over_redacted: list[tuple[str, str]] = field(default_factory=list)  # (id, redacted value)
    median_us: float | None = None

    @property
    def found(self) -> int:
        return sum(f for f, _ in self.recall.values())

    @property
    def present(self) -> int:
        return sum(n for _, n in self.recall.values())

    @property
    def recall_rate(self) -> float:
        return self.found / self.present if self.present else 0.0

    @property
    def false_positive_rate(self) -> float:
        texts = len({i for i, _ in self.false_positives})
        return texts / self.lookalikes if self.lookalikes else 0.0


def default_corpus() -> Path:
    return data_root() / "redaction" / "corpus.jsonl"


def load_corpus(path: Path) -> list[CorpusEntry]:
    """Every entry of a corpus file; a bad line raises `CorpusError` naming it and the field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such corpus file (the project ships "
                          "data/redaction/corpus.jsonl; restore it with git)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: cannot read ({exc})") from None
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise CorpusError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise CorpusError(f"{where}: must be a JSON object")
        for name in ("id", "kind", "text"):
            if not isinstance(row.get(name), str):
                raise CorpusError(f"{where}: field '{name}' must be a string")
        secrets = row.get("secrets")
        if not isinstance(secrets, list) or not all(isinstance(s, str) and s for s in secrets):
            raise CorpusError(f"{where}: field 'secrets' must be a list of non-empty strings")
        if row.get("split") not in SPLITS:
            raise CorpusError(f"{where}: field 'split' must be one of {', '.join(SPLITS)}")
        if missing := [s for s in secrets if s not in row["text"]]:
            raise CorpusError(f"{where}: field 'secrets' names {missing[0]!r}, which is not in "
                              "the text")
        entries.append(CorpusEntry(row["id"], row["kind"], row["text"], tuple(secrets),
                                   row["split"]))
    return entries


def _occurrences(text: str, secret: str) -> list[tuple[int, int, bool]]:
    """(start, end, stands alone) of every occurrence of `secret` in `text`."""
    out, start = [], text.find(secret)
    while start >= 0:
        end = start + len(secret)
        alone = not ((start > 0 and secret[0].isalnum() and text[start - 1].isalnum())
                     or (end < len(text) and secret[-1].isalnum() and text[end].isalnum()))
        out.append((start, end, alone))
        start = text.find(secret, start + 1)
    return out


def _covered(span: tuple[int, int], findings: list[Finding]) -> bool:
    return any(f.start <= span[0] and span[1] <= f.end for f in findings)


def is_found(text: str, secret: str, findings: list[Finding]) -> bool:
    """Whether `secret` counts as found in `text` (see the module docstring)."""
    spots = _occurrences(text, secret)
    return any(_covered(s[:2], findings) for s in spots) and all(
        _covered(s[:2], findings) for s in spots if s[2])


def evaluate(entries: list[CorpusEntry], *, repeat: int = 1) -> Scores:
    """Score `scan`/`redact` on the corpus (see the module docstring)."""
    scores = Scores()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in entries:
        findings = scan(entry.text)
        if entry.lookalike:
            scores.lookalikes += 1
            scores.false_positives += [(entry.id, entry.text[f.start:f.end]) for f in findings]
            continue
        scores.secret_texts += 1
        labelled = [o for s in entry.secrets for o in _occurrences(entry.text, s)]
        for finding in findings:
            if not any(finding.start < end and start < finding.end for start, end, _ in labelled):
                scores.over_redacted.append((entry.id, entry.text[finding.start:finding.end]))
        for secret in entry.secrets:
            counts[entry.kind][1] += 1
            if is_found(entry.text, secret, findings):
                counts[entry.kind][0] += 1
            else:
                scores.misses.append((entry.id, secret))
    scores.recall = {kind: (f, n) for kind, (f, n) in sorted(counts.items())}
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        for entry in entries:
            redact(entry.text)
        times.append((time.perf_counter() - start) / max(1, len(entries)) * 1e6)
    scores.median_us = statistics.median(times)
    return scores


def report(scores: Scores, *, corpus: Path, repeat: int, show: int) -> str:
    """The printed table."""
    over = len({i for i, _ in scores.over_redacted})
    lines = [f"corpus {corpus}: {scores.secret_texts} texts with {scores.present} secrets, "
             f"{scores.lookalikes} look-alike texts", "",
             f"{'kind':<22} {'found':>5} / {'n':<4} recall"]
    for kind, (found, n) in scores.recall.items():
        lines.append(f"{kind:<22} {found:>5} / {n:<4} {found / n:6.1%}")
    fp_texts = len({i for i, _ in scores.false_positives})
    lines += ["", f"recall: {scores.found}/{scores.present} = {scores.recall_rate:.1%}",
              f"false-positive rate: {fp_texts}/{scores.lookalikes} look-alike texts with a "
              f"redaction = {scores.false_positive_rate:.1%}",
              f"over-redaction: {over}/{scores.secret_texts} texts with a secret had something "
              "else redacted too",
              f"time: median {scores.median_us:.0f} us per redact() call "
              f"(n={scores.secret_texts + scores.lookalikes} texts, {repeat} passes)"]
    for title, items in (("missed", scores.misses), ("false positives", scores.false_positives),
                         ("over-redacted", scores.over_redacted)):
        if items and show:
            lines.append(f"\n{title} (first {min(show, len(items))} of {len(items)}):")
            lines += [f"  {i}: {v[:70]!r}" for i, v in items[:show]]
    return "\n".join(lines)


app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0] if __doc__ else None)


@app.command()
def main(
    corpus: Annotated[Path | None, typer.Option(help="corpus JSONL (default: "
                                                "data/redaction/corpus.jsonl)")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="timing passes (the median is shown)")] = 5,
    show: Annotated[int, typer.Option(min=0, help="misses/false positives to list")] = 20,
) -> None:
    """Print recall by kind, the false-positive rate and the time per call."""
    path = corpus or default_corpus()
    entries = load_corpus(path)
    for split in SPLITS:
        chosen = [e for e in entries if e.split == split]
        scores = evaluate(chosen, repeat=repeat)
        print(f"== {split} split ==")
        print(report(scores, corpus=path, repeat=repeat, show=show) + "\n")


if __name__ == "__main__":
    run_cli(app)
