"""Arm files of the second paper's policies, written from clean histories: a hand-made native
one, a real study history (DeepSeek V4 Flash, native reasoning in several segments) and the
shipped cpu-tiny text-protocol history. Each must pass the reasoning-only invariant."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from compaction_bench.common.paths import histories_root
from compaction_bench.histories.compaction.compactor import self_compressor
from compaction_bench.histories.compaction.ledger import read_ledger
from compaction_bench.histories.format.history import History, load_history, save_history
from compaction_bench.histories.policies.armfile import (
    PolicyArmError,
    policy_fork_cost,
    scorer_of,
    settled_of,
    write_arm_files,
)
from compaction_bench.histories.policies.registry import parse_arm, stepwise_policy
from compaction_bench.histories.policies.scorer import ScorerConfig
from compaction_bench.histories.policies.segments import SKIP, split_segments

# every test here scores or tokenizes with the converted proxy model (`proxy_model`): e2e
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("proxy_model")]

VACCINE = (histories_root() / "study" / "deepseek-v4-flash__vaccine-decision-v2__rep-01__seed-"
           "101000" / "clean.json")
ARMS = ["entropy", "step-entropy", "delete-all-thinking", "keep-latest", "random-30"]


def test_a_real_native_history_pruned_online_at_the_fork(scorer_config: ScorerConfig,
                                                         tmp_path: Path) -> None:
    shutil.copy(VACCINE, tmp_path / "clean.json")
    clean = load_history(tmp_path / "clean.json")
    [result] = write_arm_files(tmp_path / "clean.json", ["entropy"], scorer=scorer_config)
    assert result.written, result.problems
    arm = load_history(tmp_path / "entropy.json")
    policy = arm.provenance["policy"]
    sizes = [len(split_segments(m.get("reasoning") or "")) for m in clean.messages
             if m["role"] == "assistant"]
    assert sizes == [1, 5, 6]  # the source's three steps
    assert [e["outcome"] for e in policy["edits"]] == ["single-segment", "pruned", "pruned"]
    assert [len(e["removed_segments"]) for e in policy["edits"]] == [0, 4, 4]  # floor(0.8 N)
    pruned = [m["reasoning"] for m in arm.messages if m["role"] == "assistant"]
    assert pruned[0] == clean.messages[2]["reasoning"]
    assert [s.text for s in split_segments(pruned[1])].count(SKIP) == 4
    assert policy["invariant"]["reasoning_fields"] == ["messages[4].reasoning",
                                                       "messages[6].reasoning"]
    assert policy["totals"]["scorer_calls"] == 2 and policy["totals"]["scorer_s"] > 0
    assert policy["scorer"]["device"] == "cpu" and policy["settled"] == [2, 4, 6]
    assert scorer_of(arm) == scorer_config and settled_of(arm) == [2, 4, 6]
    for a, b in zip(clean.messages, arm.messages, strict=True):
        assert {k: v for k, v in a.items() if k != "reasoning"} == {
            k: v for k, v in b.items() if k != "reasoning"}
    lines = read_ledger(tmp_path / "compaction" / "ledger.jsonl")
    assert [line["context"]["phase"] for line in lines] == ["fork"] * 3


def test_the_shipped_text_history_gets_every_policy_arm(scorer_config: ScorerConfig,
                                                        tmp_path: Path) -> None:
    shutil.copy(histories_root() / "fix-median" / "clean.json", tmp_path / "clean.json")
    results = write_arm_files(tmp_path / "clean.json", ARMS, scorer=scorer_config, seed=3)
    assert [r.arm for r in results if r.written] == ARMS, [r.problems for r in results]
    thoughts = {arm: [m["content"].split("\n\n```")[0] for m in load_history(
        tmp_path / f"{arm}.json").messages if m["role"] == "assistant"] for arm in ARMS}
    clean = [m["content"].split("\n\n```")[0] for m in load_history(
        tmp_path / "clean.json").messages if m["role"] == "assistant"]
    assert thoughts["entropy"] == thoughts["step-entropy"] == clean  # one line: N = 1
    assert thoughts["delete-all-thinking"] == ["THOUGHT:", "THOUGHT:"]
    assert thoughts["keep-latest"] == ["THOUGHT:", clean[1]]  # the fork's own turn is latest
    assert all(t.startswith("THOUGHT: ") and t != c for t, c in zip(thoughts["random-30"], clean,
                                                                     strict=True))
    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(tmp_path / "clean.json", again / "clean.json")
    write_arm_files(again / "clean.json", ["random-30"], scorer=scorer_config, seed=3)
    assert load_history(again / "random-30.json").messages == load_history(
        tmp_path / "random-30.json").messages  # seeded: the same tokens go
    assert settled_of(load_history(tmp_path / "keep-latest.json")) == [2]


def test_a_step_over_the_scorer_limit_is_written_unpruned(make_native: Callable[..., History],
                                                          tmp_path: Path) -> None:
    save_history(make_native("alpha beta\n\ngamma delta"), tmp_path / "clean.json")
    tight = ScorerConfig(model="embedded:smollm2-135m-instruct", max_input_tokens=20)
    [result] = write_arm_files(tmp_path / "clean.json", ["entropy"], scorer=tight)
    assert result.written
    edits = load_history(tmp_path / "entropy.json").provenance["policy"]["edits"]
    assert [e["outcome"] for e in edits] == ["skipped-scorer-limit"]
    assert "exceeds the limit of 20" in edits[0]["error"]
    assert load_history(tmp_path / "entropy.json").messages == load_history(
        tmp_path / "clean.json").messages


def test_an_entropy_arm_past_the_scorer_context_is_refused_and_fails_its_continuation(
        make_native: Callable[..., History], scorer_config: ScorerConfig,
        tmp_path: Path) -> None:
    """A history that outgrew the scorer's context (SmolLM2: 8,192 tokens) but not the paper's
    42K limit: no arm file (it would be clean's under the entropy name) and a continuation's
    policy does not apply; each says the sizes and SCORER=. Before, both passed unpruned."""
    clean = make_native("The median is computed by sorting the list. " * 1200,
                        "alpha beta\n\ngamma delta")
    save_history(clean, tmp_path / "clean.json")
    [result] = write_arm_files(tmp_path / "clean.json", ["entropy"], scorer=scorer_config)
    assert not result.written and not (tmp_path / "entropy.json").exists()
    [problem] = result.problems
    assert problem.startswith("message 4: scorer input of ") and "SCORER=" in problem
    assert "context of 8192 tokens" in problem
    policy = stepwise_policy(parse_arm("entropy"), reasoning_mode="native",
                             protocol="tool_calls", scorer=scorer_config, seed=0)
    policy.prepare([*clean.messages, {"role": "tool", "tool_call_id": "call-1",
                                      "content": "PENDING-RESULT"}])
    reason = policy.not_applied()
    assert reason is not None and "context of 8192 tokens" in reason


def test_one_writer_for_compaction_and_the_policies_read_back_by_the_bench(
        scorer_config: ScorerConfig, tmp_path: Path) -> None:
    """Compaction is one more policy of the one writer: one call writes a compaction arm and a
    second-paper arm, each with the provenance the bench reads back (its fork-rewrite cost, the
    policy's scorer and settled steps); arms with no file of their own are skipped."""
    from compaction_bench.bench.run.arm import fork_rewrite_cost

    shutil.copy(histories_root() / "fix-median" / "clean.json", tmp_path / "clean.json")
    # fix-median's blocks are at most 12 words: they stay as they are, the compressor unasked
    nowhere = self_compressor("http://127.0.0.1:9/v1")
    results = write_arm_files(tmp_path / "clean.json",
                              ["clean", "self", "delete-all-thinking", "placebo"],
                              compressors={"self": nowhere}, scorer=scorer_config)
    assert [(r.arm, r.written) for r in results] == [("self", True),
                                                     ("delete-all-thinking", True)]
    compacted = load_history(tmp_path / "self.json")
    assert compacted.provenance["compaction"]["invariant"]["passed"]
    assert fork_rewrite_cost(compacted) == {
        "fork_rewrite_s": 0.0, "fork_rewrite_requests": 0, "fork_rewrite_prompt_tokens": 0,
        "fork_rewrite_completion_tokens": 0, "fork_rewrite_cache_hits": 0}
    assert results[0].blocks and all(b["outcome"] == "identity-short" for b in results[0].blocks)
    deleted = load_history(tmp_path / "delete-all-thinking.json")
    assert deleted.provenance["policy"]["invariant"]["passed"]
    assert scorer_of(deleted) == scorer_config and settled_of(deleted) == [2, 4]
    assert policy_fork_cost(deleted)["fork_rewrite_requests"] == 0  # deleting scores nothing
    lines = read_ledger(tmp_path / "compaction" / "ledger.jsonl")  # one ledger for both kinds
    assert {line.get("kind", "compaction") for line in lines} == {"compaction", "policy"}
    with pytest.raises(PolicyArmError, match="arm external: no compressor 'external' given"):
        write_arm_files(tmp_path / "clean.json", ["external"], compressors={"self": nowhere})
    with pytest.raises(PolicyArmError, match="arm keep-latest: its policy needs a scorer"):
        write_arm_files(tmp_path / "clean.json", ["keep-latest"])
