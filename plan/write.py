"""The plan's files: `write_plan` builds the plan of a run folder (`planner.build_plan`) and
writes plan.json, plan.md, plan.html and the plots into it. plan.html is plan.md through the
report's renderer (bench/report/document.py: one self-contained page, the plots embedded). The
renderers (planfile, writeup, figures) take data only: what `make plan-check` found
(plan_check.json), where it ran, is read here and handed to plan.md's writer, so no renderer
reads a file and nothing in plan/ imports in a circle."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.report.document import from_markdown, to_html
from compaction_bench.common.files import write_json_atomic, write_text_atomic
from compaction_bench.plan.check import CHECK_JSON
from compaction_bench.plan.figures import draw_plots
from compaction_bench.plan.planfile import plan_json
from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig, PlanError
from compaction_bench.plan.writeup import plan_markdown


@dataclass(frozen=True)
class PlanFiles:
    markdown: Path
    json: Path
    plots: tuple[Path, ...]
    html: Path


def read_check(run_dir: Path) -> dict[str, Any] | None:
    """The run's plan_check.json (`make plan-check`), or None where it was not checked."""
    path = run_dir / CHECK_JSON
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: not a plan-check result ({exc}); delete it or run `make "
                        f"plan-check` again") from exc
    if not isinstance(found, dict):
        raise PlanError(f"{path}: not a plan-check result (a JSON object); delete it or run "
                        "`make plan-check` again")
    return found


def write_plan(config: PlanConfig) -> PlanFiles:
    """Build the plan and write plan.json, plan.md and the plots into the run folder."""
    plan = build_plan(config)
    out = config.run_dir
    plots = draw_plots(plan, out / "plots") if config.plots else ()
    document: dict[str, Any] = plan_json(plan, plots)
    write_json_atomic(out / "plan.json", document)
    markdown = plan_markdown(plan, document, plots, check=read_check(out))
    write_text_atomic(out / "plan.md", markdown)
    write_text_atomic(out / "plan.html", to_html(from_markdown(
        markdown, {p.name: p.read_bytes() for p in plots})))
    return PlanFiles(out / "plan.md", out / "plan.json", tuple(plots), out / "plan.html")
