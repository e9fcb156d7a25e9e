"""Two or more runs side by side in one table, refused where they did not measure the same thing.

Runs compare only when they ran the same task with the same arms: a different task or arm set
changes what "paired change vs clean" means, and a table would hide that.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compaction_bench.bench.analysis.paired import POOLED, RunAnalysis, analyze
from compaction_bench.bench.analysis.repeats import CONDITIONAL, spread_of
from compaction_bench.bench.report.changes import CLEAN_CONTEXT, change_cell
from compaction_bench.bench.report.document import Document, Paragraph, Section, Table, to_markdown
from compaction_bench.bench.report.repeats import spread_text
from compaction_bench.bench.runfolder import AnalysisError, read_run, regime_sort_key
from compaction_bench.common.files import write_text_atomic


class RunMismatchError(AnalysisError):
    """The runs to compare differ in task or arms."""


def check_comparable(analyses: Sequence[RunAnalysis]) -> None:
    """Raise RunMismatchError naming each run's task and arms when they do not all match."""
    if len(analyses) < 2:
        raise RunMismatchError("compare needs at least two run folders; pass two or more")
    tasks = {str(a.records.manifest.get("task")) for a in analyses}
    arms = {a.arms for a in analyses}
    problems = []
    if len(tasks) > 1:
        problems.append("tasks differ: " + ", ".join(
            f"{a.run_id}={a.records.manifest.get('task', 'not stated')}" for a in analyses))
    if len(arms) > 1:
        problems.append("arms differ: " + ", ".join(
            f"{a.run_id}=[{', '.join(a.arms)}]" for a in analyses))
    if problems:
        raise RunMismatchError(
            "cannot compare runs " + ", ".join(a.run_id for a in analyses) + ": "
            + "; ".join(problems) + ". Compare only runs of the same task with the same arms."
        )


def comparison_document(analyses: Sequence[RunAnalysis]) -> Document:
    """One table: a row per regime (and pooled) and arm, a column per run."""
    check_comparable(analyses)
    names = sorted({n for a in analyses for n in a.primary if n != POOLED},
                   key=regime_sort_key)
    if any(len(a.regimes) > 1 for a in analyses):
        names.append(POOLED)
    rows = [
        ("profile", "", *(str(a.records.manifest.get("profile", "not stated")) for a in analyses),
         ""),
    ]
    routers = [a.records.manifest.get("router") for a in analyses]
    if any(isinstance(r, dict) for r in routers):  # runs through a router: which policy
        rows.append(("router policy", "", *(
            str(r.get("policy", "not stated")) if isinstance(r, dict) else "one server"
            for r in routers), ""))
    for name in names:
        found = [a.primary.get(name) for a in analyses]
        rows.append((name, CLEAN_CONTEXT, *(
            "—" if c is None or c.clean_median_s is None
            else f"{c.clean_median_s:.1f} s (n={c.n_blocks})" for c in found), ""))
        for arm in analyses[0].arms:
            if arm == "clean":
                continue
            cells = []
            for c in found:
                change = None if c is None else c.arms.get(arm)
                cells.append("—" if change is None else
                             f"{change_cell(change.postfork, with_n=True)}; faster "
                             f"{change.postfork.n_faster}/{change.postfork.n}")
            rows.append((name, arm, *cells, spread_text(spread_of(name, arm, found))))
    task = analyses[0].records.manifest.get("task", "not stated")
    section = Section(f"Task {task}: postfork marginal time, complete original blocks").add(
        Paragraph("Paired median change vs clean with its 95% order-statistic interval over "
                  "blocks; each run is analysed on its own blocks. Pooled rows pool each run's own "
                  "pooled_regimes. The last column is the spread between the runs: the highest "
                  "run's median minus the lowest's. " + CONDITIONAL),
        Table(("Regime", "Arm", *(a.run_id for a in analyses), "spread between runs"),
              tuple(rows)),
    )
    return Document("Run comparison: " + " vs ".join(a.run_id for a in analyses), (section,))


def compare_runs(run_dirs: Sequence[Path], out: Path | None = None, *, seed: int = 0) -> str:
    """Compare run folders; write the Markdown to `out` when given, and return it."""
    analyses = [analyze(read_run(path), seed=seed) for path in run_dirs]
    text = to_markdown(comparison_document(analyses))
    if out is not None:
        write_text_atomic(out, text)
    return text
