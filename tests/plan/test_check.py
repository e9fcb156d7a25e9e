"""The fleet plan checked against two replicas behind a router (issue 24, item 6), on synthetic
sweeps with a known truth (conftest.py): the plan's one-replica sweep, and check sweeps at the
planned fleet for two replicas. A router that spreads the fleet evenly gives each replica N / 2
agents (the check's truth: slope b / 2 per agent of the whole fleet), so the prediction holds;
one that sends the whole fleet's load to one replica's worth of capacity (slope b) does not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.plan.check import (
    Fleet,
    check_markdown,
    check_plan,
    fleet_of,
    plan_settings,
    write_check,
)
from compaction_bench.plan.observations import observe
from compaction_bench.plan.planner import build_plan
from compaction_bench.plan.settings import PlanConfig, PlanError
from compaction_bench.plan.write import write_plan

URLS = ["http://127.0.0.1:18401", "http://127.0.0.1:18402"]


def _config(run: Path, slo: float) -> PlanConfig:
    return PlanConfig(run_dir=run, slo=f"p90:{slo}s", bootstrap=300, plots=False)


def _setup(truth: Any, make_sweep: Callable[..., Path]) -> tuple[PlanConfig, int, list[Path]]:
    slo = truth.quantile(5.5, 0.9)
    plan_run = make_sweep("plan", seed=1)
    config = _config(plan_run, slo)
    agents = build_plan(config).capacity["clean"].agents
    assert agents is not None
    planned = 2 * agents
    even = type(truth)(b=truth.b / 2)  # each replica carries N / 2
    checks = [
        make_sweep("check-round_robin", seed=2, truth=even, levels=(planned,), per_level=200,
                   config={"replica_urls": URLS, "router_policy": ["round_robin"]}),
        make_sweep("check-bad", seed=3, truth=truth, levels=(planned,), per_level=200,
                   config={"replica_urls": URLS, "router_policy": ["round_robin", "bad"]})]
    return config, planned, checks


def test_the_check_reports_prediction_error_and_the_slo_per_policy(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    config, planned, checks = _setup(truth, make_sweep)
    plan, rows = check_plan(config, checks)
    by = {(r.policy, r.arm): r for r in rows}
    assert set(by) == {(p, a) for p in ("round_robin", "bad") for a in ("clean", "self")}
    even = by[("round_robin", "clean")]
    assert even.level == planned and even.planned and even.replicas == 2
    assert even.per_replica == planned / 2 and even.n == 200
    assert even.held and even.measured_s is not None and even.measured_ci is not None
    assert even.measured_ci[0] <= even.measured_s <= even.measured_ci[1]
    # the truth at N / 2 per replica is what the one-replica curve predicts
    assert even.predicted_s is not None and abs(even.error_pct or 0) < 10
    assert abs(even.measured_s - truth.quantile(planned / 2, 0.9)) / even.measured_s < 0.1
    bad = by[("bad", "clean")]
    true_error = (truth.quantile(planned / 2, 0.9) / truth.quantile(planned, 0.9) - 1) * 100
    assert not bad.held and bad.error_pct is not None and bad.error_pct < -15
    assert abs(bad.error_pct - true_error) < 10
    assert even.slo_s == plan.capacity["clean"].slo_s


def test_each_row_says_what_the_routing_did_predicted_against_measured(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    plan_run = make_sweep("plan", seed=1, requests=True)
    config = PlanConfig(run_dir=plan_run, slo=f"p90:{truth.quantile(5.5, 0.9)}s",
                        bootstrap=200, plots=False)
    check = make_sweep("check-round_robin", seed=2, levels=(8,), per_level=40, requests=True,
                       config={"replica_urls": URLS, "router_policy": ["round_robin"]})
    _, rows = check_plan(config, [check])
    (row,) = [r for r in rows if r.arm == "clean"]
    assert row.model == "fleet model" and row.predicted_s is not None
    # each measured continuation: three requests of 1000, 1500 and 2000 prompt tokens with
    # 900 cached; its later turns' share is (900 + 900) / (1500 + 2000)
    assert row.measured_hit_rate == pytest.approx(1800 / 3500)
    assert row.predicted_hit_rate is not None and 0 <= row.predicted_hit_rate <= 1
    # no replica counters in this folder: which replica served a request is not known
    assert row.measured_hottest_share is None
    assert row.predicted_hottest_share is not None and row.predicted_hottest_share >= 0.5
    markdown = check_markdown(build_plan(config), rows)
    assert "later-turn hit rate, predicted / measured" in markdown
    assert f"/ {round(100 * 1800 / 3500)}%" in markdown
    # the check's N = 8 on 2 replicas (4 each) decodes as the truth's N = 8, slower than the
    # plan's one replica at N = 4 by (20 + 5 x 8) / (20 + 5 x 4) = 1.5: said, with the cause
    assert row.fleet_itl_s is not None and row.replica_itl_s is not None
    assert row.fleet_itl_s / row.replica_itl_s == pytest.approx(1.5, rel=0.15)
    assert "Slower replicas: in 2 of 2 rows" in markdown and "reserve nothing" in markdown
    calm = make_sweep("check-calm", seed=3, levels=(8,), per_level=40, requests=True,
                      truth=type(truth)(b=truth.b / 2),
                      config={"replica_urls": URLS, "router_policy": ["round_robin"]})
    _, same = check_plan(config, [calm])  # decodes as the plan's replica: nothing said
    assert "Slower replicas" not in check_markdown(build_plan(config), same)


def test_the_files_and_the_policy_line_in_plan_md(truth: Any,
                                                  make_sweep: Callable[..., Path]) -> None:
    config, planned, checks = _setup(truth, make_sweep)
    write_plan(config)
    unchecked = (config.run_dir / "plan.md").read_text()
    before = {name: (config.run_dir / name).read_bytes() for name in ("plan.md", "plan.json")}
    assert "unchecked: measure it with `make plan-check" in unchecked
    assert f"(the planned fleet for 2 replicas: clean {planned}, self " in unchecked
    markdown, document, _ = write_check(plan_settings(config.run_dir), checks[:1])
    data = json.loads(document.read_text())
    assert data["schema"] == "compbench.plan_check" and data["policies"] == ["round_robin"]
    assert {r["arm"] for r in data["rows"]} == {"clean", "self"}
    assert all(r["n"] == 200 and r["replicas"] == 2 for r in data["rows"])
    text = markdown.read_text()
    assert f"| round_robin | 2 | clean | {planned} (planned) |" in text
    # the check never rewrites the plan it checks (issue 29)
    assert {name: (config.run_dir / name).read_bytes() for name in before} == before
    write_plan(config)  # the next plan states the policy it was checked under
    plan_md = (config.run_dir / "plan.md").read_text()
    assert "GPU counts assume the routing policy they were checked under" in plan_md
    assert "round_robin (SLO held at every checked level, largest prediction error" in plan_md


def test_the_check_uses_the_plans_own_settings(truth: Any,
                                               make_sweep: Callable[..., Path]) -> None:
    """Issue 29: plan-check rebuilt the plan from its own flags' defaults (SLO p90:2x, 100
    agents, no price) and wrote that over plan.md. Now it reads the settings the plan was made
    with, and a plan that was never made is refused."""
    _, _, checks = _setup(truth, make_sweep)
    plan_run = make_sweep("plan-own", seed=1)
    with pytest.raises(PlanError, match=r"plan.json: no plan to check; make it first: "
                       r"make plan RUN=plan-own"):
        plan_settings(plan_run)
    made = PlanConfig(run_dir=plan_run, slo="p90:150s", agents=1000, gpu_hour_usd=3.6,
                      extrapolation=3.0, bootstrap=300, seed=4, plots=False)
    write_plan(made)
    before = (plan_run / "plan.md").read_bytes()
    settings = plan_settings(plan_run)
    assert settings.model_dump(exclude={"plots"}) == made.model_dump(exclude={"plots"})
    plan, rows = check_plan(settings, checks[:1])
    assert plan.config.slo == "p90:150s" and plan.config.agents == 1000
    assert {r.slo_s for r in rows} == {150.0}
    write_check(settings, checks[:1])
    assert (plan_run / "plan.md").read_bytes() == before
    stored = json.loads((plan_run / "plan.json").read_text())
    stored["config"] = {"slo": "p90:fast"}
    (plan_run / "plan.json").write_text(json.dumps(stored))
    with pytest.raises(PlanError, match=r"plan.json: field config is not a plan's settings"):
        plan_settings(plan_run)


def test_the_policy_and_replicas_come_from_the_manifest(
        make_sweep: Callable[..., Path]) -> None:
    run = make_sweep("run-7-cache_aware", levels=(2,), config={
        "router_policy": ["round_robin", "cache_aware"]})
    fleet = fleet_of(observe(run))
    assert fleet.policy == "cache_aware" and fleet.replicas is None
    assert fleet_of(observe(run), replicas=3).replicas == 3
    served = make_sweep("served", levels=(2,))
    manifest = json.loads((served / "manifest.json").read_text())
    manifest["router"] = {"policy": "consistent_hash", "replicas": URLS,
                          "started_by": "make serve REPLICAS=2 on port 18400"}
    (served / "manifest.json").write_text(json.dumps(manifest))
    assert fleet_of(observe(served)) == Fleet(2, "consistent_hash")
    with pytest.raises(PlanError, match=r"manifest.json: names no replicas.*replicas=R"):
        check_plan(_config(make_sweep("plan", levels=(1, 2, 4)), 60.0), [run])


@pytest.mark.e2e
def test_make_plan_check_prints_the_prediction_error(
        truth: Any, make_sweep: Callable[..., Path]) -> None:
    config, planned, checks = _setup(truth, make_sweep)
    write_plan(config)
    plan_md = (config.run_dir / "plan.md").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "compaction_bench", "plan", "check", str(config.run_dir),
         *map(str, checks)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"round_robin x2 clean N={planned}: predicted ")
               and "SLO held, prediction error " in line and "(n=200)" in line
               for line in lines), done.stdout
    assert any(line.startswith("bad x2 clean") and "SLO MISSED" in line for line in lines)
    assert (config.run_dir / "plan_check.md").is_file()
    assert "plan.md is unchanged" in done.stdout
    assert (config.run_dir / "plan.md").read_bytes() == plan_md


def test_plan_check_takes_replicas_as_a_word_a_flag_or_a_make_variable(
        make_sweep: Callable[..., Path]) -> None:
    """Issue 31: one settings grammar. The check runs' manifests name no replicas here, so the
    check needs REPLICAS; each way of giving it reaches the check, a bad one is one line."""
    import os

    from typer.testing import CliRunner

    from compaction_bench.plan.cli import app

    plan_run = make_sweep("plan-words", levels=(1, 2, 4))
    write_plan(PlanConfig(run_dir=plan_run, slo="p90:60s", bootstrap=100, plots=False))
    check = make_sweep("check-words", levels=(2,), config={"router_policy": ["round_robin"]})
    cleared = {k: None for k in os.environ if k in ("MAKEFLAGS", "REPLICAS")
               or k.startswith("COMPBENCH_")}

    def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
        return CliRunner().invoke(app, ["plan-check", str(plan_run), str(check), *args],
                                  env={**cleared, **(env or {})})

    missing = invoke()
    assert isinstance(missing.exception, PlanError)
    assert "give replicas=R (make plan-check REPLICAS=R)" in str(missing.exception)
    outputs = []
    for args, env in ((("replicas=2",), None), (("--replicas", "2"), None),
                      (("--from-env",), {"MAKEFLAGS": " -- REPLICAS=2", "REPLICAS": "2"})):
        done = invoke(*args, env=env)
        assert done.exit_code == 0, (args, done.output, done.exception)
        outputs.append([line for line in done.stdout.splitlines() if " x2 " in line])
    assert outputs[0] and outputs[0] == outputs[1] == outputs[2]
    refused = invoke("replicas=0")  # SettingsError: one line at the command's top (run_cli)
    assert refused.exit_code != 0 and "replicas: Input should be greater than or equal to 1" in (
        str(refused.exception))


def test_the_one_replica_step_time_is_interpolated_between_measured_levels() -> None:
    """A fleet of 7 on 2 replicas has 3.5 agents each; a sweep of 2 and 4 has no such level, so
    plan-check's `ms per token` column was empty for every odd fleet. Between two measured
    levels it is interpolated (and says so); outside them it is not extrapolated."""
    from compaction_bench.plan.check import replica_itl
    from compaction_bench.transport.request import RequestRecord

    def record(level: int, itl_s: float) -> RequestRecord:  # 11 tokens: 10 gaps of itl_s
        return RequestRecord(request_id=f"r{level}", sent_s=0.0, status="ok", source="clean",
                             first_token_s=1.0, end_s=1.0 + 10 * itl_s, completion_tokens=11,
                             labels={"level": level})

    requests = [record(2, 0.080), record(4, 0.100), record(8, 0.140)]
    assert replica_itl(requests, "clean", 4) == (pytest.approx(0.100), False)
    assert replica_itl(requests, "clean", 3.5) == (pytest.approx(0.095), True)
    assert replica_itl(requests, "clean", 6) == (pytest.approx(0.120), True)
    assert replica_itl(requests, "clean", 1.5) == (None, False)  # below the lowest level
    assert replica_itl(requests, "clean", 9) == (None, False)
    assert replica_itl(requests, "external", 3) == (None, False)
