"""The policy comparison on a hand-made run folder with known totals: whole-continuation tokens
paired against clean, task success as paired percentage points, the scorer's cost from the
ledger, and the report's table and Pareto figure drawn from them."""

from __future__ import annotations

import json
from pathlib import Path

from compaction_bench.bench.analysis.paired import analyze, comparison_rng
from compaction_bench.bench.analysis.tradeoffs import compare_policies, success_change
from compaction_bench.bench.report.run_report import write_report
from compaction_bench.bench.runfolder import (
    ArmRecord,
    BlockRecord,
    RequestRecord,
    read_run,
    write_json,
    write_records,
)

BLOCKS = 4


def write_run(path: Path) -> Path:
    arms, requests, blocks, ledger = [], [], [], []
    for block in range(1, BLOCKS + 1):
        for arm, time_s, prompt, passed in (("clean", 100.0, 1000, True),
                                            ("entropy", 80.0, 600, block != 2)):
            arms.append(ArmRecord("dedicated", block, arm, "original", "complete", time_s,
                                  rewrite_s=0.5 if arm == "entropy" else 0.0, turns=2,
                                  reasoning_tokens=100, validation=passed))
            for k in range(2):  # two requests per continuation: sums are 2 x prompt, 2 x 10
                requests.append(RequestRecord(
                    request_id=f"{arm}-{block}-{k}", sent_s=10.0 * block + k, status="ok",
                    source=arm, regime="dedicated", block=block, end_s=10.0 * block + k + 0.5,
                    prompt_tokens=prompt, cached_tokens=prompt // 2, completion_tokens=10,
                    labels={"attempt": "original"}))
        blocks.append(BlockRecord("dedicated", block, ("clean", "entropy"), 10.0 * block,
                                  10.0 * block + 5))
        ledger.append({"kind": "policy", "policy": "entropy", "outcome": "pruned",
                       "scorer_s": 0.25, "scorer_tokens": 500, "device": "cpu",
                       "context": {"regime": "dedicated", "block": block, "attempt": "original",
                                   "phase": "continuation"}})
    write_json(path / "manifest.json", {"run_id": path.name, "arms": ["clean", "entropy"]})
    write_records(path / "arms.jsonl", arms)
    write_records(path / "blocks.jsonl", blocks)
    write_records(path / "requests.jsonl", requests)
    (path / "ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in ledger))
    return path


def test_whole_continuation_tokens_success_and_policy_cost(tmp_path: Path) -> None:
    records = read_run(write_run(tmp_path / "policies"))
    analysis = analyze(records)
    [row] = compare_policies(records, analysis.blocks, analysis.arms)["dedicated"].rows
    assert row.arm == "entropy" and row.postfork.median_pct == -20.0 and row.postfork.n == 4
    assert (row.input_tokens.arm_median, row.input_tokens.reference_median) == (1200, 2000)
    assert row.input_tokens.median_pct == -40.0 and row.output_tokens.median_pct == 0.0
    assert row.cached_tokens.median_pct == -40.0
    assert (row.success.n, row.success.arm_successes, row.success.clean_successes) == (4, 3, 4)
    assert row.success.difference_pp == -25.0
    assert row.success.ci_low_pp is not None and row.success.ci_low_pp <= -25.0
    assert row.scorer_s_median == 0.25 and row.scorer_tokens_median == 500
    assert row.devices == ("cpu",) and row.edits == {"pruned": 4}
    assert row.rewrite_s_median == 0.5


def test_success_change_needs_three_blocks_for_an_interval() -> None:
    two = success_change([True, False], [True, True], comparison_rng(0, "t"))
    assert (two.difference_pp, two.ci_low_pp) == (-50.0, None)
    none = success_change([], [], comparison_rng(0, "t"))
    assert none.n == 0 and none.difference_pp is None


def test_the_report_shows_the_comparison_and_the_pareto_figure(tmp_path: Path) -> None:
    files = write_report(write_run(tmp_path / "reported"))
    markdown = files.markdown.read_text()
    section = markdown.split("## Policy comparison")[1].split("## ")[0]
    # 4 blocks: no interval of a median below 6 (issue 22), and the cell says so
    assert ("| entropy | medians 80.0 vs clean 100.0 (ratio of medians -20.0%); median of paired "
            "changes -20.0% (n=4, no interval below 6) |") in section
    assert "3/4 vs clean 4/4; -25 pp [" in section and "scorer 0.25 s, 500 tokens (cpu)" in section
    assert "(plots/policy_pareto.png)" in markdown
    summary = json.loads(files.summary.read_text())
    entropy = summary["policies"]["dedicated"]["arms"]["entropy"]
    assert entropy["input_tokens"]["paired_median_change_pct"] == -40.0
    assert summary["cache_accounting"]["checked"] == 0  # no token ids in these records
    assert "No arm request carried token ids" in markdown
