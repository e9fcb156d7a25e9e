"""The routing comparison (one run per policy) and the run report's replica section, on
synthetic run folders with replica lines and request records whose truth is known."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.report.compare import RunMismatchError
from compaction_bench.bench.report.replicas import replica_sections
from compaction_bench.bench.report.routing import routing_file, write_routing
from compaction_bench.bench.report.run_report import write_report
from compaction_bench.bench.runfolder import read_run, write_json


def _routed(run: Path, policy: str, replicas: dict[str, tuple[float, float, float]]) -> Path:
    """Make a synthetic run folder one made through a router: its manifest names the policy,
    and replica_metrics.jsonl holds two scrapes per replica, (routed, queries, hits) apart."""
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["router"] = {"policy": policy, "url": "http://127.0.0.1:1",
                          "replicas": list(replicas)}
    manifest["routing"] = {"base": "rt", "policies": ["round_robin", "consistent_hash"]}
    write_json(run / "manifest.json", manifest)
    lines = []
    for url, (routed, queries, hits) in replicas.items():
        lines.append({"t_s": 0.0, "replica": url, "requests_finished": 0.0,
                      "routed_requests": 0.0, "prefix_cache_queries": 0.0,
                      "prefix_cache_hits": 0.0, "num_requests_waiting": 0.0})
        lines.append({"t_s": 1e6, "replica": url, "requests_finished": routed,
                      "routed_requests": routed, "prefix_cache_queries": queries,
                      "prefix_cache_hits": hits, "num_requests_waiting": 3.0})
    (run / "replica_metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_the_comparison_shows_each_policys_change_cache_and_replicas(
        make_run: Callable[..., Path], tmp_path: Path) -> None:
    rr = _routed(make_run("rt-round_robin", regimes=("dedicated",), ratios={"external": 0.9},
                          noise=1e-6),
                 "round_robin", {"http://r1": (40, 8000, 2000), "http://r2": (40, 8000, 2100)})
    ch = _routed(make_run("rt-consistent_hash", regimes=("dedicated",),
                          ratios={"external": 0.7}, noise=1e-6),
                 "consistent_hash", {"http://r1": (70, 14000, 12000),
                                     "http://r2": (10, 2000, 1500)})
    out = routing_file(tmp_path, "rt")
    text = write_routing("rt", {"round_robin": rr, "consistent_hash": ch}, out,
                         missing={"random": "not run: an earlier policy's run ended early"})
    assert out.read_text() == text and out.name == "rt-routing.md"
    assert "policies, in the order they ran: round_robin, consistent_hash; not run: random" in (
        text)
    rows = [line for line in text.splitlines() if line.startswith("| dedicated | external |")]
    assert [row.split(" | ")[2] for row in rows] == ["round_robin", "consistent_hash"]
    changes = [float(row.split(" | ")[3].split("%")[0]) for row in rows]
    assert changes == pytest.approx([-10.0, -30.0], abs=0.01)  # each policy's own change
    assert all("(n=6" in row for row in rows)
    # the synthetic arms' requests report 60% of external's prompts cached, 90% of clean's
    assert all(row.split(" | ")[5].startswith("60% (n=6)") for row in rows)
    clean = [line for line in text.splitlines() if line.startswith("| dedicated | clean |")]
    assert len(clean) == 2 and all("reference: clean median (context" in row for row in clean)
    # per-replica traffic per policy, from the counters
    assert "## Replicas under round_robin" in text and "## Replicas under consistent_hash" in text
    assert "| http://r1 | 70 (88%) | 70 | 14000 | 12000 | 86% |" in text
    assert "| http://r2 | 40 (50%) | 40 | 8000 | 2100 | 26% |" in text
    assert "not interleaved" in text  # what a difference between policies also carries


def test_runs_of_different_arms_are_not_compared(make_run: Callable[..., Path],
                                                 tmp_path: Path) -> None:
    a = _routed(make_run("a", regimes=("dedicated",), blocks=2,
                          ratios={"external": 0.9}), "round_robin", {"http://r1": (1, 1, 1)})
    b = _routed(make_run("b", regimes=("dedicated",), blocks=2,
                          ratios={"self": 0.9}), "random", {"http://r1": (1, 1, 1)})
    with pytest.raises(RunMismatchError, match="arms differ"):
        write_routing("x", {"round_robin": a, "random": b}, tmp_path / "x-routing.md")
    assert not (tmp_path / "x-routing.md").exists()


def test_a_run_through_a_router_reports_its_replicas(make_run: Callable[..., Path]) -> None:
    run = _routed(make_run("one", regimes=("dedicated",), blocks=2), "consistent_hash",
                  {"http://r1": (30, 6000, 4500), "http://r2": (10, 2000, 0)})
    report = write_report(run).markdown.read_text()
    section = report[report.index("## Replicas behind the router"):]
    assert "Routing policy: consistent_hash" in section
    assert "| http://r1 | 30 (75%) | 30 | 6000 | 4500 | 75% |" in section
    assert "0.00 / 0" not in section and "/ 3 |" in section  # the waiting gauge's max
    assert "| dedicated | external | " in section  # the continuation's hit rate per arm
    plain = analyze(read_run(make_run("plain", regimes=("dedicated",), blocks=2)))
    assert replica_sections(plain) == []  # one server: no such section
