"""The study's compaction rules, pinned against the suite's one fake OpenAI-compatible server.

The fake (`loadgen.fakeserver`) answers chat completions with scripted drafts, so a rule's
outcome is known exactly (a real model's draft would be random). It also records every request
body, which is how "the compressor never sees an observation" is checked.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.common.net import free_port
from compaction_bench.common.paths import histories_root
from compaction_bench.histories.compaction.arms import compaction_dir
from compaction_bench.histories.compaction.compactor import (
    CompactionCache,
    Compactor,
    external_compressor,
    payload,
    self_compressor,
)
from compaction_bench.histories.compaction.endpoint import EndpointConfig
from compaction_bench.histories.compaction.judge import (
    GateError,
    JudgeConfig,
    check_gate,
    gate_failures,
    judge_block,
)
from compaction_bench.histories.compaction.ledger import Ledger, read_ledger
from compaction_bench.histories.compaction.prompts import load_prompt
from compaction_bench.histories.format.history import Fork, History, load_history, save_history
from compaction_bench.histories.policies.armfile import write_arm_files
from compaction_bench.histories.policies.compacting import ContinuousCompaction, policy_for
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

STUDY = histories_root() / "study"
VACCINE = STUDY / "deepseek-v4-flash__vaccine-decision-v2__rep-01__seed-101000" / "clean.json"
LONG = ("I should look at the median function first because the failing test says the even "
        "length case returns the wrong value for lists of four items")  # 26 words


class Fake:
    """Scripted drafts on the fake server: a string (the draft), ("length", text) for a draft
    cut at the cap, ("status", code), or ("garbage", event) for a stream event that is not a
    chat chunk. Unscripted requests get "short record"."""

    def __init__(self, process: FakeProcess) -> None:
        self.process = process
        self.url = process.api_url

    def queue(self, *replies: Any) -> None:
        script: list[dict[str, Any]] = []
        for reply in replies:
            if isinstance(reply, tuple) and reply[0] == "length":
                script.append({"content": reply[1], "finish_reason": "length"})
            elif isinstance(reply, tuple) and reply[0] == "status":
                script.append({"status": reply[1]})
            elif isinstance(reply, tuple) and reply[0] == "garbage":
                script.append({"events": [reply[1]]})
            else:
                script.append({"content": reply, "usage": {
                    "prompt_tokens": 100, "completion_tokens": 10}})
        self.process.script(script)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.process.requests()

    def sent_text(self) -> str:
        return json.dumps(self.requests)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, default_content="short record")) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeProcess) -> Fake:
    server.reset()
    return Fake(server)


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def text_history(thought: str = LONG) -> History:
    """A tagged-visible text-protocol history (what cpu-tiny acquires), observation marked."""
    return History(
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the median."},
            {"role": "assistant", "content": f"THOUGHT: {thought}\n\n```bash\ncat stats.py\n```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\nOBSERVATION-"
                                        "MARKER def median(xs): ...\n</output>"},
            {"role": "assistant", "content": f"THOUGHT: Now {thought}\n\n```bash\npytest -q\n```"},
        ],
        task="fix-median", reasoning_mode="tagged-visible", action_protocol="text",
        fork=Fork(message_index=4, action={"command": "pytest -q"},
                  pending_result="PENDING-MARKER 1 failed"))


# --- the rules ---------------------------------------------------------------------------------

@pytest.mark.e2e
def test_block_of_at_most_twelve_words_stays_identical_without_a_request(
        fake: Fake) -> None:
    compactor = Compactor(self_compressor(fake.url))
    twelve = " ".join(f"w{i}" for i in range(12))
    got = compactor.compact(twelve, "bash")
    assert (got.outcome, got.record, got.drafts, fake.requests) == (
        "identity-short", twelve, 0, [])
    assert compactor.compact(twelve + " w12", "bash").outcome == "rewritten"
    assert len(fake.requests) == 1
    assert [e.outcome for e in compactor.ledger.entries] == ["identity-short", "rewritten"]


@pytest.mark.e2e
def test_draft_not_shorter_in_words_reverts_to_the_raw_block(fake: Fake) -> None:
    fake.queue(" ".join(["word"] * 26))  # as many words as LONG
    compactor = Compactor(self_compressor(fake.url))
    got = compactor.compact(LONG, "bash")
    assert (got.outcome, got.record, got.words_out) == ("reverted-not-shorter", LONG, 26)
    entry = compactor.ledger.entries[0]
    assert entry.outcome == "reverted-not-shorter" and entry.context["draft_words"] == 26


@pytest.mark.e2e
def test_rewrite_is_recorded_with_tokens_prompt_hash_and_cost(fake: Fake,
                                                              tmp_path: Path) -> None:
    fake.queue("```\nMedian even case wrong for 4 items; read stats.py.\n```")
    config = self_compressor(fake.url, price_per_prompt_token=1e-6,
                             price_per_completion_token=2e-6)
    compactor = Compactor(config, ledger=Ledger(tmp_path / "ledger.jsonl"))
    got = compactor.compact(LONG, "bash")
    assert got.outcome == "rewritten"
    assert got.record == "Median even case wrong for 4 items; read stats.py."  # fence stripped
    row = read_ledger(tmp_path / "ledger.jsonl")[0]
    assert row["prompt_sha256"] == load_prompt("telegraphic").sha256
    assert (row["words_in"], row["words_out"], row["prompt_tokens"], row["completion_tokens"]) == (
        26, 9, 100, 10)
    assert row["cost"] == pytest.approx(100 * 1e-6 + 10 * 2e-6)
    assert row["latency_s"] > 0 and row["block_sha256"] == got.block_sha256
    assert fake.requests[0]["temperature"] == 0.0 and fake.requests[0]["model"] == "compressor"


@pytest.mark.e2e
def test_cache_hits_on_the_same_raw_text_and_action_across_processes(fake: Fake,
                                                                     tmp_path: Path) -> None:
    cache_file = tmp_path / "cache.jsonl"
    first = Compactor(self_compressor(fake.url), cache=CompactionCache(cache_file))
    assert first.compact(LONG, "bash").outcome == "rewritten"
    assert first.compact(LONG, "bash").cache_hit
    assert len(fake.requests) == 1
    first.compact(LONG, "str_replace_editor")  # another action name: another rewrite
    assert len(fake.requests) == 2
    again = Compactor(self_compressor(fake.url), cache=CompactionCache(cache_file))  # from disk
    hit = again.compact(LONG, "bash")
    assert hit.cache_hit and hit.record == "short record" and len(fake.requests) == 2
    other_prompt = Compactor(self_compressor(fake.url, prompt="telegraphic-evidence"),
                             cache=CompactionCache(cache_file))
    assert not other_prompt.compact(LONG, "bash").cache_hit


@pytest.mark.e2e
def test_empty_draft_raises_the_cap_and_three_drafts_is_the_limit(fake: Fake) -> None:
    fake.queue(*["", "", ""])
    compactor = Compactor(self_compressor(fake.url, max_tokens=100, max_tokens_limit=300))
    got = compactor.compact(LONG, "bash")
    assert got.outcome == "failed" and got.record == LONG and "empty draft" in str(got.error)
    assert [r["max_tokens"] for r in fake.requests] == [100, 200, 300]


@pytest.mark.e2e
def test_truncated_draft_raises_the_cap_unless_already_not_shorter(fake: Fake) -> None:
    fake.queue(*[("length", "Median even case wrong"), "Median even case wrong; read."])
    got = Compactor(self_compressor(fake.url, max_tokens=100)).compact(LONG, "bash")
    assert got.outcome == "rewritten" and got.record == "Median even case wrong; read."
    assert [r["max_tokens"] for r in fake.requests] == [100, 200]
    fake.queue(("length", " ".join(["rambling"] * 40)))
    got = Compactor(self_compressor(fake.url, max_tokens=100)).compact(LONG + " x", "bash")
    assert got.outcome == "reverted-not-shorter" and len(fake.requests) == 3


@pytest.mark.e2e
def test_a_draft_echoing_the_prompt_is_garbage(fake: Fake) -> None:
    echo = load_prompt("telegraphic").text[:200]  # what a base model that ignores it returns
    fake.queue(*[echo] * 3)
    got = Compactor(external_compressor(fake.url)).compact(LONG * 10, "bash")
    assert got.outcome == "failed" and "echoes the rewrite prompt" in str(got.error)


@pytest.mark.e2e
def test_dropped_hard_threshold_gets_one_repair_request(fake: Fake) -> None:
    raw = ("Check constraints: risk <= 0.05 and reliability >= 0.94 for options V2 and V3; we "
           "have no risk data yet so we must simulate both options before deciding anything")
    fake.queue(*["V2, V3: reliability >= 0.94 unknown; simulate.",
                         "V2, V3: risk <= 0.05, reliability >= 0.94 unknown; simulate."])
    got = Compactor(self_compressor(fake.url)).compact(raw, "simulate")
    assert got.repaired and got.outcome == "rewritten" and got.missing_required == []
    repair = fake.requests[1]["messages"][1]["content"]
    assert raw in repair and "V2, V3: reliability >= 0.94 unknown; simulate." in repair
    assert repair.endswith("0.05")
    assert len(fake.requests) == 2


@pytest.mark.e2e
def test_failed_repair_keeps_the_first_draft_and_records_what_it_lacks(
        fake: Fake) -> None:
    raw = LONG + " and risk <= 0.05 must hold"
    fake.queue(*["Median wrong for 4 items.", ("status", 500), ("status", 500)])
    got = Compactor(self_compressor(fake.url)).compact(raw, "bash")
    assert got.outcome == "rewritten" and got.missing_required == ["0.05"]


@pytest.mark.e2e
def test_compressor_sees_only_the_block_and_the_action_name(fake: Fake,
                                                            tmp_path: Path) -> None:
    clean_path = tmp_path / "clean.json"
    save_history(text_history(), clean_path)
    [arm] = write_arm_files(clean_path, ["self"], compressors={"self": self_compressor(fake.url)})
    assert arm.written, arm.problems
    assert len(fake.requests) == 2
    prompt = load_prompt("telegraphic").text
    for body, block in zip(fake.requests, [LONG, f"Now {LONG}"], strict=True):
        assert body["messages"] == [{"role": "system", "content": prompt},
                                    {"role": "user", "content": payload(block, "bash")}]
    assert "MARKER" not in fake.sent_text() and "cat stats.py" not in fake.sent_text()
    # the same during a continuation of the arm: a new block after the pending observation
    arm_history = load_history(tmp_path / "self.json")
    later = [{"role": "user", "content": "PENDING-MARKER"},
             {"role": "assistant", "content": f"THOUGHT: Again {LONG}\n\n```bash\nls\n```"}]
    cache = CompactionCache(compaction_dir(clean_path) / "cache.jsonl")  # arm writing's cache
    policy = policy_for(arm_history, self_compressor(fake.url), cache=cache)
    sent = policy.prepare([*arm_history.messages, *later])
    assert len(fake.requests) == 3 and "MARKER" not in fake.sent_text()
    # continuing clean.json with the policy gives the same request, all from that cache
    from_clean = policy_for(load_history(clean_path), self_compressor(fake.url),
                            name="self", cache=cache)
    assert from_clean.prepare([*text_history().messages, *later]) == sent
    assert len(fake.requests) == 3


@pytest.mark.e2e
def test_redaction_before_an_external_compressor_and_restored_locally(fake: Fake) -> None:
    raw = LONG + " then export API_KEY=sk-abcdefghijklmnopqrstuvwx and DB_PASSWORD=hunter22"
    fake.queue("Median wrong; export API_KEY=[REDACTED-SECRET-1]")
    got = Compactor(external_compressor(fake.url)).compact(raw, "bash")
    assert "sk-abcdefghijklmnopqrstuvwx" not in fake.sent_text()
    assert "hunter22" not in fake.sent_text()
    assert got.redactions == 2
    assert got.record == "Median wrong; export API_KEY=sk-abcdefghijklmnopqrstuvwx"
    Compactor(self_compressor(fake.url)).compact(raw, "bash")  # self: the same server, no redaction
    assert "hunter22" in json.dumps(fake.requests[-1])


# --- failures leave everything already written as it was ---------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("reply", [("status", 503), ("garbage", "<html>not json</html>")])
def test_broken_compressor_leaves_clean_and_old_arm_untouched(fake: Fake, tmp_path: Path,
                                                              reply: Any) -> None:
    clean_path = tmp_path / "clean.json"
    save_history(text_history(), clean_path)
    (tmp_path / "self.json").write_text("previous arm\n")
    before = clean_path.read_bytes()
    fake.queue(*[reply] * 6)
    [arm] = write_arm_files(clean_path, ["self"], compressors={"self": self_compressor(fake.url)})
    assert not arm.written and "compressor failed" in arm.problems[0]
    assert clean_path.read_bytes() == before
    assert (tmp_path / "self.json").read_text() == "previous arm\n"
    rows = read_ledger(tmp_path / "compaction" / "ledger.jsonl")
    assert [r["outcome"] for r in rows] == ["failed", "failed"]
    assert not (tmp_path / "compaction" / "cache.jsonl").exists()  # failures are not cached
    [again] = write_arm_files(clean_path, ["self"],  # the endpoint is back
                              compressors={"self": self_compressor(fake.url)})
    assert again.written


def test_endpoint_down_is_a_failed_block_naming_the_url(tmp_path: Path) -> None:
    url = closed_port_url()
    got = Compactor(external_compressor(url)).compact(LONG, "bash")
    assert got.outcome == "failed" and url in str(got.error) and got.record == LONG


# --- arms and continuous compaction -------------------------------------------------------------

@pytest.mark.e2e
def test_arm_from_a_real_native_history_passes_the_invariant(fake: Fake,
                                                             tmp_path: Path) -> None:
    shutil.copy(VACCINE, tmp_path / "clean.json")
    fake.queue(*["Quote <= 1,000,000 unverifiable; sites >= 2; reliability >= 0.94, "
                         "risk <= 0.05 unknown.",
                         "V1 fails sites >= 2; V2 V3 V4 V5 pass; quote <= 1,000,000, reliability "
                         ">= 0.94, risk <= 0.05 lack data; simulate V2-V5."])
    [arm] = write_arm_files(tmp_path / "clean.json", ["external"],
                            compressors={"external": external_compressor(fake.url)})
    assert arm.written, arm.problems
    saved = load_history(tmp_path / "external.json")
    clean = load_history(tmp_path / "clean.json")
    assert saved.arm == "external" and saved.continuation == []
    blocks = saved.provenance["compaction"]["blocks"]
    assert [b["outcome"] for b in blocks] == ["identity-short", "rewritten", "rewritten"]
    assert [b["drafts"] for b in blocks] == [0, 1, 1]  # no repair was needed
    assert blocks[2]["lexical"]["missing_required"] == []
    assert "simulate_vaccine_options" in blocks[2]["lexical"]["missing_identifiers"]
    assert saved.provenance["compaction"]["invariant"]["reasoning_fields"] == [
        "messages[4].reasoning", "messages[6].reasoning"]
    for a, b in zip(clean.messages, saved.messages, strict=True):
        assert {k: v for k, v in a.items() if k != "reasoning"} == {
            k: v for k, v in b.items() if k != "reasoning"}


@pytest.mark.e2e
def test_continuous_policy_compacts_only_new_blocks_and_leaves_its_input(
        fake: Fake) -> None:
    history = text_history()
    policy = ContinuousCompaction(Compactor(self_compressor(fake.url)), name="self",
                                  reasoning_mode="tagged-visible", protocol="text")
    messages = [*history.messages, {"role": "user", "content": "obs"}]
    snapshot = json.dumps(messages)
    sent = policy.prepare(messages)
    assert json.dumps(messages) == snapshot
    assert sent[2]["content"] == "THOUGHT: short record\n\n```bash\ncat stats.py\n```"
    assert sent[3] is messages[3] and len(fake.requests) == 2
    messages.append({"role": "assistant", "content": f"THOUGHT: Third {LONG}\n\n```bash\nls\n```"})
    policy.prepare(messages)
    assert len(fake.requests) == 3 and [c["new_blocks"] for c in policy.calls] == [2, 1]
    assert policy.rewrite_s > 0


@pytest.mark.e2e
def test_judge_verdicts_and_the_gate(fake: Fake) -> None:
    config = JudgeConfig(endpoint=EndpointConfig(api_url=fake.url, model="judge"))
    good = {"verdict": "pass", "critical_or_material_issue": False,
            "future_result_leakage": False, "requested_action_preserved": True,
            "explanation": "ok"}
    fake.queue(*[json.dumps(good), json.dumps({**good, "future_result_leakage": True}),
                         "I think it passes"])
    verdicts = [judge_block(LONG, "short", "bash({})", config) for _ in range(3)]
    assert [v.passed for v in verdicts] == [True, False, False]
    assert verdicts[2].error is not None and "no JSON object" in verdicts[2].error
    assert fake.requests[0]["messages"][0]["content"] == load_prompt("judge-a4").text
    blocks = [{"message_index": 2, "judge": verdicts[1].to_json(), "missing_required": []},
              {"message_index": 4, "missing_required": ["0.05"]}]
    assert gate_failures(blocks, "off") == []
    assert len(gate_failures(blocks, "judge")) == 1 and len(gate_failures(blocks, "strict")) == 2


@pytest.mark.e2e
def test_a_repair_that_is_not_shorter_keeps_the_usable_first_draft(fake: Fake) -> None:
    raw = LONG + " and risk <= 0.05 must hold"
    fake.queue("Median wrong for 4 items.", " ".join(["rambling"] * 40))
    got = Compactor(self_compressor(fake.url)).compact(raw, "bash")
    assert got.outcome == "rewritten" and got.record == "Median wrong for 4 items."
    assert got.repaired and got.missing_required == ["0.05"]


@pytest.mark.e2e
def test_a_draft_after_a_rejected_one_is_sampled_with_a_new_seed(fake: Fake) -> None:
    echo = load_prompt("telegraphic").text[:200]
    fake.queue(echo, "Median wrong for 4 items.")
    got = Compactor(external_compressor(fake.url)).compact(LONG * 10, "bash")
    assert got.outcome == "rewritten" and got.drafts == 2
    first, second = fake.requests
    assert (first["temperature"], second["temperature"]) == (0.0, 0.7)
    assert second["seed"] == first["seed"] + 1  # never the identical greedy request again


def test_a_judge_gate_without_a_judge_refuses_to_start() -> None:
    with pytest.raises(GateError, match="needs a fidelity judge"):
        check_gate("judge", None)
    assert check_gate("off", None) == "off"
