"""`make bench` end to end against the real vLLM CPU server: three-arm blocks, records, summary.

The external compressor endpoint is the session server's `compressor` name here, to spare a
third cold start: on cpu-tiny no reasoning block exceeds 12 words, so no compressor request is
made at all (the ledger shows identity-short), and `make bench` itself starts the embedded
Gemma server for the external arm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.serve.launcher import Server

pytestmark = pytest.mark.integration
ROOT = repo_root()


def run_bench(server: Server, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compaction_bench", "bench", "source=agent", "profile=cpu-tiny",
         f"base_url={server.api_url}", f"external_url={server.api_url}", "step_limit=2",
         *args], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "COMPBENCH_RESULTS": str(tmp)})


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dedicated_blocks_complete_as_independent_repeats(cpu_server: Server,
                                                         tmp_path: Path) -> None:
    done = run_bench(cpu_server, tmp_path, "regime=dedicated", "blocks=3",
                     "run_id=ded")
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "ded"
    arms = lines(run / "arms.jsonl")
    assert sorted(a["arm"] for a in arms) == sorted(["clean", "external", "self"] * 3)
    assert all(a["status"] == "complete" and a["protocol_ok"] for a in arms), arms
    assert all(a["postfork_s"] > 0 and a["history_tokens"] for a in arms)
    # different seeds, and different trajectories, across blocks
    clean = {a["block"]: a for a in arms if a["arm"] == "clean"}
    assert len({a["seed"] for a in clean.values()}) == 3
    arm_requests = [r for r in lines(run / "requests.jsonl")
                    if r["source"] in ("clean", "external", "self")]
    trajectories: dict[tuple[int, str], list[str]] = {}
    for r in arm_requests:
        trajectories.setdefault((r["block"], r["source"]), []).append(r["labels"]["reply_sha256"])
    by_block = {b: {tuple(t) for (block, _), t in trajectories.items() if block == b}
                for b in clean}
    assert len(set().union(*by_block.values())) > 1, trajectories  # not one replay 3 times
    # the fork's cache state, the tokenizer-counted reasoning, the invariant on the wire
    assert all(a["fork_cache_state"] in ("cold", "partial", "warm") for a in arms)
    assert all(a["reasoning_source"] == "tokenizer" and a["reasoning_tokens"] > 0 for a in arms)
    assert all(a["invariant"]["passed"] for a in arms)
    requests = lines(run / "requests.jsonl")
    sources = {r["source"] for r in requests}
    assert {"clean", "external", "self"} <= sources  # and any compressor traffic, recorded:
    assert sources <= {"clean", "external", "self", "external/compressor", "self/compressor"}
    assert all(r["first_token_s"] >= r["sent_s"] for r in requests if r["status"] == "ok")
    block = lines(run / "blocks.jsonl")[0]
    assert sorted(block["order"]) == ["clean", "external", "self"]
    assert block["load"]["users"] == 0 and block["invalid_reasons"] == []
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["selfcheck"]["passed"] is True  # checked before the first block
    for key in ("config", "server", "packages", "hardware", "git", "histories", "seeds"):
        assert manifest[key], key
    assert manifest["structured_text"] is True
    summary = json.loads((run / "summary.json").read_text())
    dedicated = summary["regimes"]["dedicated"]["arms"]
    assert dedicated["self"]["blocks_complete"] == 3
    assert summary["regimes"]["dedicated"]["fork_cache_states"]["clean"]
    assert 0 <= dedicated["clean"]["cache_hit_rate"] <= 1
    ledger = lines(run / "ledger.jsonl") if (run / "ledger.jsonl").exists() else []
    assert all(e["outcome"] in {"identity-short", "rewritten", "reverted-not-shorter"}
               for e in ledger)
    report = (run / "report.md").read_text()
    for heading in ("Background load per block", "Prefix cache at the fork",
                    "What these numbers can say", "Serving figures (vLLM benchmark names)"):
        assert f"## {heading}" in report
    assert (run / "report.html").is_file()


def test_overloaded_block_queues_requests(cpu_server: Server, tmp_path: Path) -> None:
    # two arms: what is tested is the overload around them (the external arm, a third of the
    # test's two minutes, runs in the dedicated test above). The background's turns are capped
    # at 128 tokens: 8 users on max_num_seqs 4 queue the arms all the same, and the recorded
    # turns of up to ~1,100 tokens made the arms' two steps wait 145 s (2026-12-07)
    done = run_bench(cpu_server, tmp_path, "regime=overloaded", "blocks=1", "arms=clean,self",
                     "run_id=ovl", "background_max_tokens=128")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[bench] run ovl: overloaded, 8 background users" in done.stderr
    run = tmp_path / "ovl"
    arms = lines(run / "arms.jsonl")
    assert len(arms) == 2 and all(a["status"] == "complete" for a in arms), arms
    background = [r for r in lines(run / "requests.jsonl") if r["source"] == "background"]
    assert any(r["status"] == "ok" and r["block"] == 1 for r in background)
    assert all(r["intended_send_s"] is not None for r in background)
    assert all(r["labels"]["max_tokens"] <= 128 for r in background)
    assert any(r["labels"]["max_tokens_source"] == "cap" for r in background)
    # each background user has its own cache salt, this run's: N users cost what N agents do
    salts = {(r["labels"]["user"], r["labels"]["cache_salt"]) for r in background}
    assert all(salt.startswith("ovl-") for _, salt in salts), salts
    assert len({salt for _, salt in salts}) == len({user for user, _ in salts}) > 1, salts
    waiting = [m.get("num_requests_waiting") or 0 for m in lines(run / "metrics.jsonl")]
    assert max(waiting) > 0  # the overload is real: requests queued on the server
    summary = json.loads((run / "summary.json").read_text())
    assert summary["regimes"]["overloaded"]["max_requests_waiting"] > 0
    (block,) = lines(run / "blocks.jsonl")
    assert block["invalid_reasons"] == [], block["invalid_reasons"]
    assert block["load"]["achieved_concurrency"] > 1 and block["load"]["max_waiting"] > 0
    assert lines(run / "load.jsonl") and all(s["running"] for s in lines(run / "load.jsonl"))
    assert json.loads((run / "manifest.json").read_text())["service_probe"]["tokens_per_s"] > 0


def test_self_inline_runs_beside_self_and_the_report_shows_both_costs(cpu_server: Server,
                                                                       tmp_path: Path) -> None:
    done = run_bench(cpu_server, tmp_path, "regime=dedicated", "blocks=1",
                     "arms=clean,self,self-inline", "run_id=inl")
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "inl"
    arms = {a["arm"]: a for a in lines(run / "arms.jsonl")}
    assert set(arms) == {"clean", "self", "self-inline"}
    assert all(a["status"] == "complete" and a["invariant"]["passed"] for a in arms.values())
    inline = arms["self-inline"]
    assert inline["invariant"]["in_context_compaction"] is True
    assert inline["invariant"]["replaced_messages"] > 0
    assert inline["rewrite_requests"] == 1 and inline["rewrite_s"] > 0
    assert inline["rewrite_prompt_tokens"] > 0 and inline["rewrite_cached_tokens"] is not None
    assert inline["fork_rewrite_s"] is None  # no arm file: its one request is its T_R
    compactions = [r for r in lines(run / "requests.jsonl")
                   if r["source"] == "self-inline/compressor"]
    assert len(compactions) == 1 and compactions[0]["labels"]["phase"] == "compaction"
    assert compactions[0]["model"] == "target"  # the target's own name, not the compressor's
    assert compactions[0]["cached_tokens"] == inline["rewrite_cached_tokens"]
    report = (run / "report.md").read_text()
    assert "## What compaction cost and what it found in the cache" in report
    assert "| dedicated | self-inline | in context, one summary |" in report
    assert "| dedicated | self | per reasoning block |" in report
