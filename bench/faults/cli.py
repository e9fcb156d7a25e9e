"""`make faults [ONLY=substring] [JOBS=3]`: run every fault row, print one table, exit 1 if any
row did not survive. Rows run JOBS at a time (the exclusive ones alone, after), each in a folder
of its own under a temporary directory (kept with `--keep`); the table is also written as JSON
beside the run folders."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.bench.faults.box import box_classes
from compaction_bench.bench.faults.harness import Context, FaultResult
from compaction_bench.bench.faults.hostile import hostile
from compaction_bench.bench.faults.rows import ROWS, Row
from compaction_bench.common import markdown
from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.options import (
    ConfigFile,
    FromEnv,
    ShowSettings,
    alias,
    settings_from,
    show_settings,
    words_help,
)
from compaction_bench.common.paths import results_dir

app = typer.Typer(add_completion=False, help=__doc__)
ALL_ROWS = [*ROWS, Row("hostile agent commands", hostile, exclusive=True),
            Row("the agent's box, closed", box_classes, exclusive=True)]
JOBS = 3  # rows side by side: most of a row is waiting on its bench process and fake engine


def run_rows(rows: list[Row], root: Path, *, jobs: int = JOBS,
             on_done: Callable[[Row, list[FaultResult], float], None] | None = None
             ) -> dict[str, list[FaultResult]]:
    """Run `rows`, `jobs` at a time (each in `root/<nn>`, its own folders and ports), then the
    exclusive rows one by one; their results by row name, in the rows' order."""
    found: dict[str, list[FaultResult]] = {}

    def one(number: int, row: Row) -> None:
        started = time.monotonic()
        results = row.run(Context(root / f"{number:02d}"))
        found[row.name] = results
        if on_done is not None:
            on_done(row, results, time.monotonic() - started)

    numbered = list(enumerate(rows, 1))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(one, n, r) for n, r in numbered if not r.exclusive]:
            future.result()
    for number, row in numbered:
        if row.exclusive:
            one(number, row)
    return {row.name: found[row.name] for row in rows}


def table(results: list[FaultResult]) -> str:
    return "\n".join(markdown.table(
        ("fault", "survived", "finished records lost", "the line the user saw"),
        [(r.fault, "yes" if r.survived else "NO: " + r.why,
          "?" if r.lost is None else str(r.lost), r.line) for r in results]))


class FaultsConfig(BaseModel):
    """`make faults`: which fault rows run, and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    only: str | None = Field(default=None, description="run the rows whose name holds this")
    keep: bool = Field(default=False, description="keep the rows' folders")
    jobs: int = Field(default=JOBS, ge=1, description="rows run side by side")


@app.command()
def main(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("only=sigterm jobs=2"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    only: Annotated[str | None, alias("only")] = None,
    keep: Annotated[bool | None, alias("keep", "--keep/--no-keep")] = None,
    jobs: Annotated[int | None, alias("jobs")] = None,
) -> None:
    """Inject every fault row into a real bench process; one table, exit 1 if any row did not
    survive."""
    if show:
        show_settings(FaultsConfig)
        return
    c = settings_from(FaultsConfig, "faults", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    only, keep, jobs = c.only, c.keep, c.jobs
    rows = [r for r in ALL_ROWS if only is None or only.lower() in r.name.lower()]
    if not rows:
        raise SuiteError(f"no fault row matches {only!r}; rows: "
                         + ", ".join(r.name for r in ALL_ROWS))
    root = Path(tempfile.mkdtemp(prefix="compbench-faults-"))
    started = time.monotonic()

    def progress(row: Row, found: list[FaultResult], seconds: float) -> None:
        marks = ", ".join("survived" if r.survived else "NOT SURVIVED" for r in found)
        typer.echo(f"[faults] {row.name}: {marks} ({seconds:.0f} s)", err=True)

    by_row = run_rows(rows, root, jobs=jobs, on_done=progress)
    results = [r for found in by_row.values() for r in found]
    typer.echo(table(results))
    out = results_dir() / f"faults-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    write_json_atomic(out, {"rows": [r.to_json() for r in results],
                            "seconds": round(time.monotonic() - started, 1)})
    typer.echo(f"\n{sum(r.survived for r in results)}/{len(results)} survived in "
               f"{time.monotonic() - started:.0f} s; table: {out}"
               + (f"; row folders: {root}" if keep else ""))
    if not keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if not all(r.survived for r in results):
        raise typer.Exit(ExitCode.FAILED)

