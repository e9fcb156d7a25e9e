"""Runs side by side, and the refusal to compare runs of different tasks or arms."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.report.compare import RunMismatchError, compare_runs


def test_compares_matching_runs(make_run: Callable[..., Path], tmp_path: Path) -> None:
    a = make_run("run-a", regimes=("dedicated",), blocks=6, serving=False)
    b = make_run("run-b", seed=3, regimes=("dedicated", "shared"), blocks=6, serving=False)
    out = tmp_path / "comparison.md"
    text = compare_runs([a, b], out)
    assert out.read_text() == text
    assert "| Regime | Arm | run-a | run-b |" in text
    assert "| shared | clean median (context, not the change's base) | — |" in text
    assert "(n=6); faster 6/6" in text
    assert "router policy" not in text  # neither ran through a router
    # the spread between the runs: the highest median minus the lowest, per arm and regime
    from compaction_bench.bench.analysis.paired import analyze
    from compaction_bench.bench.runfolder import read_run

    changes = [analyze(read_run(r)).primary["dedicated"].arms["self"].postfork for r in (a, b)]
    medians = [c.median_pct for c in changes if c.median_pct is not None]
    assert len(medians) == 2
    low, high = min(medians), max(medians)
    row = next(line for line in text.splitlines() if line.startswith("| dedicated | self |"))
    assert row.rstrip(" |").endswith(f"{high - low:.1f} points ({low:+.1f}% to {high:+.1f}%)")
    shared = next(line for line in text.splitlines() if line.startswith("| shared | self |"))
    assert "not stated: a run has no paired blocks" in shared  # run-a has no shared blocks
    assert "not the variation between runs, hosts or days" in text


def test_runs_through_routers_show_their_policy(make_run: Callable[..., Path]) -> None:
    import json

    a = make_run("rt-round_robin", regimes=("dedicated",), blocks=2, serving=False)
    b = make_run("plain", regimes=("dedicated",), blocks=2, serving=False)
    manifest = json.loads((a / "manifest.json").read_text())
    (a / "manifest.json").write_text(json.dumps({**manifest, "router": {
        "policy": "round_robin"}}))
    assert "| router policy |  | round_robin | one server |" in compare_runs([a, b])


def test_refuses_mismatched_arms(make_run: Callable[..., Path]) -> None:
    a = make_run("run-a", blocks=3, serving=False)
    b = make_run("run-b", blocks=3, ratios={"self": 0.8}, serving=False)
    with pytest.raises(RunMismatchError) as error:
        compare_runs([a, b])
    message = str(error.value)
    assert "run-a" in message and "run-b" in message
    assert "arms differ: run-a=[clean, external, self], run-b=[clean, self]" in message


@pytest.mark.e2e
def test_refuses_mismatched_tasks_from_the_cli(make_run: Callable[..., Path],
                                              bench_cli: Any) -> None:
    a = make_run("run-a", blocks=3, serving=False)
    b = make_run("run-b", blocks=3, task="other-task", serving=False)
    result = bench_cli("compare", str(a), str(b))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tasks differ: run-a=demo-task, run-b=other-task" in lines[0]
