"""plan-check compares only runs whose replicas had the same share of the host (issue 29, item 3):
a one-replica sweep whose server had both cores of a 2-core machine said nothing about two
replicas of one core each. On synthetic sweep run folders (conftest.py) whose manifests record
each replica's share as the bench does (`server.replicas[].host_share`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.plan.check import SHARE_NOTE, check_plan, write_check
from compaction_bench.plan.settings import PlanConfig, PlanError


def _share(cpus: list[int], quota: float | None = None, pinned: bool = True
           ) -> dict[str, Any]:
    return {"cpus": cpus, "pinned": pinned, "cpu_quota": quota, "host_cpus": 2}


def _record(run: Path, shares: list[dict[str, Any]] | None) -> Path:
    manifest = json.loads((run / "manifest.json").read_text())
    if shares is not None:
        # the check run's replicas are its config's (conftest `plan_and_check`)
        urls = (manifest.get("config", {}).get("replica_urls") if len(shares) == 2
                else ["http://127.0.0.1:18400"])
        manifest["server"]["replicas"] = [{"url": u, "host_share": s}
                                          for u, s in zip(urls, shares, strict=True)]
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def _runs(plan_and_check: Callable[..., tuple[PlanConfig, Path]],
          plan_share: list[dict[str, Any]] | None,
          check_share: list[dict[str, Any]] | None) -> tuple[PlanConfig, Path]:
    config, check = plan_and_check(lambda run: _record(run, plan_share))
    return config, _record(check, check_share)


def test_runs_whose_replicas_had_other_shares_are_refused_in_one_line(
        plan_and_check: Callable[..., tuple[PlanConfig, Path]]) -> None:
    # the case: the sweep's server unpinned on both cores, the fleet's one core each
    config, check = _runs(plan_and_check, [_share([0, 1], pinned=False)],
                          [_share([0]), _share([1])])
    with pytest.raises(PlanError) as refused:
        check_plan(config, [check])
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("plan (plan: replica 2 CPUs unpinned (0,1) of 2, no quota) and "
                           "fleet-round_robin (replicas: 1 CPU (0) of 2, no quota; 1 CPU (1) "
                           "of 2, no quota) ran under different shares of the host per replica")
    assert "serve both with the same REPLICA_CPUS / REPLICA_CPU_QUOTA" in line
    # the same CPUs but another quota is another share too
    config, check = _runs(plan_and_check, [_share([0], 0.9)], [_share([0]), _share([1])])
    with pytest.raises(PlanError, match=r"quota 0.9 CPU\) and fleet-round_robin"):
        check_plan(config, [check])


def test_equal_shares_are_compared_whichever_cpus_they_are(
        plan_and_check: Callable[..., tuple[PlanConfig, Path]]) -> None:
    config, check = _runs(plan_and_check, [_share([0], 0.9)],
                          [_share([0], 0.9), _share([1], 0.9)])
    plan, rows = check_plan(config, [check])
    assert rows and not [n for n in plan.notes if n.startswith(SHARE_NOTE)]
    markdown, _, _ = write_check(config, [check])
    assert SHARE_NOTE not in markdown.read_text()


def test_runs_that_record_no_share_are_compared_with_a_warning(
        plan_and_check: Callable[..., tuple[PlanConfig, Path]]) -> None:
    config, check = _runs(plan_and_check, None, [_share([0]), _share([1])])
    markdown, _, rows = write_check(config, [check])
    assert rows
    text = markdown.read_text()
    assert (f"{SHARE_NOTE} in plan: compared with fleet-round_robin without knowing that each "
            "replica had the same share of the host") in text
