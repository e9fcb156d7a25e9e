"""`make plan` as a user runs it: `compaction-bench plan RUN_DIR`, on a sweep, on the study's
imported B300 records (no sweep), and on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from compaction_bench.bench.analysis.study import import_study
from compaction_bench.plan.planfile import PLAN_SCHEMA, PLAN_SCHEMA_VERSION
from compaction_bench.plan.planner import NO_SWEEP

pytestmark = pytest.mark.e2e


def plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compaction_bench", "plan", *args],
                          capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_sweep_gets_the_whole_plan(make_sweep: Callable[..., Path]) -> None:
    run = make_sweep(requests=True)
    done = plan_cli(str(run), "slo=p90:70s", "agents=40", "gpu_hour_usd=2.5", "bootstrap=200")
    assert done.returncode == 0, done.stderr
    document = json.loads((run / "plan.json").read_text())
    assert (document["schema"], document["schema_version"]) == (PLAN_SCHEMA,
                                                                PLAN_SCHEMA_VERSION)
    assert document["scope"] == "sweep" and set(document["arms"]) == {"clean", "self"}
    for arm in document["arms"].values():
        agents = arm["agents_per_gpu"]
        assert agents["value"] >= 1 and len(agents["ci"]) == 2 and agents["binding"]
        assert arm["gpus_needed"]["agents"] == 40 and arm["gpus_needed"]["gpus"] >= 1
        assert arm["per_task"]["cost_unit"] == "USD" and arm["per_task"]["cost_per_task"] > 0
        assert [lv["level"] for lv in arm["levels"]] == [1, 2, 4, 8]
    times = [b for b in document["breakeven"] if b["quantity"] == "time"]
    assert {b["condition"] for b in times} == {f"sweep N={n}" for n in (1, 2, 4, 8)}
    assert all(b["n_pairs"] >= 30 and b["uses_ci"] for b in times)
    text = (run / "plan.md").read_text()
    for heading in ("Agents per GPU", "GPUs needed for 40 agents", "Break-even uses",
                    "How far the curve reaches", "What these records cannot tell"):
        assert f"## {heading}" in text or f"### {heading}" in text, heading
    assert {p.name for p in (run / "plots").iterdir()} == {
        "plan_curve.png", "plan_gpus.png", "plan_breakeven.png"}
    assert "plots/plan_curve.png" in document["plots"]
    # plan.html: plan.md through the report's renderer, every table cell and heading in it,
    # the three plots embedded (issue 31: one renderer for both documents)
    import html as html_lib

    from compaction_bench.bench.report.document import Table, from_markdown

    page = (run / "plan.html").read_text()
    assert f"html:  {run / 'plan.html'}" in done.stdout
    assert page.count("data:image/png;base64,") == 3
    parsed = from_markdown(text)
    assert [s.title for s in parsed.sections if s.title] == [
        line[3:] for line in text.splitlines() if line.startswith("## ")]
    cells = [c for s in parsed.sections for part in s.parts if isinstance(part, Table)
             for row in (part.header, *part.rows) for c in row]
    assert cells and all(html_lib.escape(c).replace("\n", "<br>") in page for c in cells)


def test_the_study_records_say_what_they_cannot_support(tmp_path: Path) -> None:
    run = import_study(out=tmp_path / "study-b300")
    done = plan_cli(str(run), "bootstrap=200")
    assert done.returncode == 0, done.stderr
    document = json.loads((run / "plan.json").read_text())
    assert document["scope"] == "regimes" and document["arms"] == {}
    assert NO_SWEEP in document["cannot"]
    assert any("requests.jsonl" in line for line in document["cannot"])
    rows = [b for b in document["breakeven"] if b["quantity"] == "time"]
    assert {b["condition"] for b in rows} == {"dedicated", "shared", "overloaded"}
    for row in rows:  # the study recorded no rewrite time: break-even per second of it
        assert row["one_time"] is None and row["uses"] is None
        assert row["n_pairs"] > 0 and row["uses_per_unit_one_time"] is not None
    # self in the ten original blocks: every pair saved time (the study's Table 12)
    dedicated = next(b for b in rows if b["arm"] == "self" and b["condition"] == "dedicated")
    assert dedicated["saving"] > 0 and dedicated["p_no_saving"] == 0.0
    assert NO_SWEEP in (run / "plan.md").read_text()


def test_bad_input_ends_in_one_line_naming_the_fix(tmp_path: Path,
                                                   make_sweep: Callable[..., Path]) -> None:
    bad = plan_cli(str(make_sweep()), "slo=fast")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: SLO='fast'")
    missing = plan_cli(str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such run folder" in missing.stderr


def test_the_cost_model_predicts_unmeasured_levels_and_another_gpu(
        make_sweep: Callable[..., Path]) -> None:
    run = make_sweep(requests=True, levels=(1, 2))
    costs = "data/kernels/cpu-intel-xeon-processor-2c__smollm2-135m-instruct__vllm-0.32.0.json"
    done = plan_cli(str(run), f"costmodel={costs}", "predict_device=NVIDIA H200",
                    "bootstrap=200")
    assert done.returncode == 0, done.stderr
    simulation = json.loads((run / "plan.json").read_text())["simulation"]
    assert simulation["transfer_device"] == "H200"
    clean = simulation["arms"]["clean"]
    assert [lv["level"] for lv in clean["levels"]] == [1, 2, 4, 8]
    assert [lv["in_measured_range"] for lv in clean["levels"]] == [True, True, False, False]
    assert clean["mape_pct"] is not None and len(clean["transferred"]) == 4
    unknown = plan_cli(str(run), f"costmodel={costs}", "predict_device=TPU v9")
    assert unknown.returncode == 2 and "kernels/limits.toml" in unknown.stderr
