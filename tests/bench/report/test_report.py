"""The report writes Markdown, HTML with embedded plots, PNG files and summary.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.report.run_report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_writes_markdown_html_and_images(reported_run: Path) -> None:
    plots = list((reported_run / "plots").iterdir())
    names = sorted(p.name for p in plots)
    assert names == ["cache_rates.png", "latency_cdfs.png", "paired_dots.png",
                     "policy_pareto.png", "server_timeseries.png"]
    for path in plots:
        assert path.read_bytes().startswith(PNG_MAGIC)
    html = (reported_run / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    markdown = (reported_run / "report.md").read_text()
    for name in names:
        assert f"(plots/{name})" in markdown
    for heading in ("Postfork marginal time", "Per-block records", "Request latency",
                    "Prefix cache", "Server queue and KV cache", "Tokens per continuation",
                    "Policy comparison", "Cache-break accounting"):
        assert f"## {heading}" in markdown


def test_every_cache_hit_rate_stands_beside_its_time_effect(reported_run: Path) -> None:
    # issue 33: a hit rate is not a speedup (a 94.59% prefix-cache hit rate gave +5.7-6.2%
    # throughput in vLLM docs PR #53395), so the table shows the time effect beside it
    summary = json.loads((reported_run / "summary.json").read_text())
    markdown = (reported_run / "report.md").read_text()
    section = markdown.split("\n## Prefix cache\n", 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in section.splitlines() if line.lstrip().startswith("|")]
    header = next(row for row in cells if row[0] == "Regime" and "Hit rate" in row)
    assert header[-1] == "Postfork time: change vs clean [95% CI]", header
    external = next(row for row in cells if row[:2] == ["dedicated", "external"])
    median = summary["regimes"]["dedicated"]["arms"]["external"]["paired_median_change_pct"]
    assert f"{median:+.2f}%" in external[-1] and "(n=6)" in external[-1], external
    clean = next(row for row in cells if row[:2] == ["dedicated", "clean"])
    assert clean[-1].startswith("reference: clean median"), clean


def test_summary_json_schema(reported_run: Path) -> None:
    summary = json.loads((reported_run / "summary.json").read_text())
    assert summary["schema_version"] == 3
    assert summary["max_requests_waiting"] > 0
    assert summary["pooled"]["regimes"] == ["dedicated", "shared", "overloaded"]
    for regime in ("dedicated", "shared", "overloaded"):
        arms = summary["regimes"][regime]["arms"]
        assert arms["clean"]["paired_median_change_pct"] is None
        assert arms["clean"]["ci_low_pct"] is None
        for arm in ("external", "self"):
            entry = arms[arm]
            assert entry["blocks_complete"] == 6
            assert entry["ci_low_pct"] <= entry["paired_median_change_pct"] <= entry["ci_high_pct"]
            assert 0.0 <= entry["share_faster"] <= 1.0
            assert 0.0 <= entry["cache_hit_rate"] <= 1.0
        # The synthetic server's counters say 900 of 1200 query tokens hit.
        assert summary["regimes"][regime]["cache_hit_rate_metrics"] == 0.75


def test_report_is_deterministic_for_a_seed(make_run: Callable[..., Path]) -> None:
    run = make_run(blocks=4, serving=False)
    first = write_report(run, seed=5).summary.read_text()
    assert write_report(run, seed=5).summary.read_text() == first


@pytest.mark.e2e
def test_cli_report_prints_paths_and_fails_cleanly(make_run: Callable[..., Path],
                                                   tmp_path: Path, bench_cli: Any) -> None:
    run = make_run(blocks=3, serving=False)
    result = bench_cli("report", str(run))
    assert result.returncode == 0, result.stderr
    assert str(run / "report.md") in result.stdout
    missing = tmp_path / "no-such-run"
    result = bench_cli("report", str(missing))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {missing}: no such run folder; pass a folder under results/ that holds "
        "arms.jsonl"]


def test_summary_has_vllm_named_serving_figures_and_a_parquet_table(reported_run: Path) -> None:
    import pandas as pd

    summary = json.loads((reported_run / "summary.json").read_text())
    figures = summary["serving"]["overloaded"]["clean"]
    for key in ("completed", "failed", "duration", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms",
                "p99_e2el_ms", "median_e2el_intended_ms"):
        assert key in figures, key
    assert figures["completed"] > 0 and figures["median_ttft_ms"] > 0
    assert figures["mean_ttft_ms"] <= figures["p99_ttft_ms"]
    assert "background" in summary["serving"]["shared"]
    table = pd.read_parquet(reported_run / "requests.parquet")
    requests = [line for line in (reported_run / "requests.jsonl").read_text().splitlines()
                if line.strip()]
    assert len(table) == len(requests)
    assert {"request_id", "source", "ttft_s", "tpot_s", "e2el_s", "send_lag_s"} <= set(table)
    ok = table[table["status"] == "ok"]
    assert ok["ttft_s"].notna().all() and (ok["e2el_s"] >= ok["ttft_s"]).all()
    assert "## Serving figures (vLLM benchmark names)" in (reported_run / "report.md").read_text()


def test_a_run_on_an_uncompiled_server_says_so(make_run: Callable[..., Path]) -> None:
    run = make_run(blocks=3, serving=False)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "config": {"fast_start": True}}))
    report = write_report(run).markdown.read_text()
    assert "started uncompiled (FAST_START=1, --optimization-level 0)" in report
    assert "compare these times only with runs made the same way" in report
