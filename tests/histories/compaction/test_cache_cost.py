"""The persistent rewrite cache and the fork rewrite cost T_R (issue 22): an entry is shared only
by compressors that make the very same rewrite request, and an arm written from cache hits
states the rewrite's measured cost, marked as from cache, never a T_R of 0."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.histories.compaction.compactor import (
    CompactionCache,
    Compactor,
    external_compressor,
    self_compressor,
)
from compaction_bench.histories.format.history import Fork, History, load_history, save_history
from compaction_bench.histories.policies.armfile import write_arm_files
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess

LONG = ("I should look at the median function first because the failing test says the even "
        "length case returns the wrong value for lists of four items")  # 26 words
URL = "http://127.0.0.1:8000/v1"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    # 40 ms to the first token: every live rewrite has a latency well above zero
    with FakeProcess(FakeConfig(ttft_ms=40, itl_ms=0, default_content="short record")) as process:
        yield process


def clean_history(turns: int) -> History:
    """A text-protocol clean history of `turns` long thoughts, the last turn the fork."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "S"},
                                      {"role": "user", "content": "U"}]
    for number in range(1, turns + 1):
        messages.append({"role": "assistant",
                         "content": f"THOUGHT: {number} {LONG}\n\n```bash\nls {number}\n```"})
        if number < turns:
            messages.append({"role": "user", "content": f"OBS {number}"})
    return History(messages=messages, task="t", reasoning_mode="tagged-visible",
                   action_protocol="text",
                   fork=Fork(message_index=len(messages) - 1, action={"command": f"ls {turns}"},
                             pending_result="PENDING"))


def test_the_identity_changes_with_every_setting_that_changes_a_rewrite() -> None:
    base = self_compressor(URL)
    changed = [
        self_compressor("http://127.0.0.1:8100/v1"),  # another server, no model named
        self_compressor(URL, model="other"),
        self_compressor(URL, max_tokens=256),
        self_compressor(URL, max_tokens_limit=512),
        self_compressor(URL, max_tokens_per_raw_word=2.0),
        self_compressor(URL, max_drafts=1),
        self_compressor(URL, retry_temperature=0.3),
        base.model_copy(update={"redact": True}),
        self_compressor(URL, cache_tag="embedded:smollm2-135m-instruct"),
        base.model_copy(update={"endpoint": base.endpoint.model_copy(
            update={"temperature": 0.6})}),
        base.model_copy(update={"endpoint": base.endpoint.model_copy(
            update={"extra_body": {"top_k": 5}})}),
        external_compressor(URL).model_copy(update={"redact": False}),  # another arm's
    ]
    identities = [c.identity for c in changed]
    assert base.identity not in identities and len(set(identities)) == len(identities)
    # what changes whether or what a rewrite costs, not its record, keeps the identity
    same = [self_compressor(URL, price_per_prompt_token=1e-6),
            base.model_copy(update={"endpoint": base.endpoint.model_copy(
                update={"request_timeout_s": 5.0, "api_key_env": "OTHER_KEY"})})]
    assert {c.identity for c in same} == {base.identity}
    # a named model: the port it is served on does not matter
    assert self_compressor(URL, cache_tag="m").identity == self_compressor(
        "http://127.0.0.1:8100/v1", cache_tag="m").identity


@pytest.mark.e2e
def test_an_arm_written_from_cache_hits_states_the_measured_rewrite_cost(
        fake: FakeProcess, tmp_path: Path) -> None:
    """`self` rewrites three blocks live; `self-every-3` (the same compressor, the same calls)
    is written from its cache entries without a request and is charged their measured cost,
    marked as from cache. Before, its T_R read 0 s and 0 requests as if measured."""
    from compaction_bench.bench.run.arm import fork_rewrite_cost

    fake.reset()
    save_history(clean_history(3), tmp_path / "clean.json")
    config = self_compressor(fake.api_url, price_per_prompt_token=1e-6)
    [own] = write_arm_files(tmp_path / "clean.json", ["self"], compressors={"self": config})
    assert own.written and own.totals["cache_hits"] == 0 and len(fake.requests()) == 3
    live = own.totals["latency_s"]
    assert live >= 3 * 0.04

    [every] = write_arm_files(tmp_path / "clean.json", ["self-every-3"],
                              compressors={"self": config})
    assert every.written and len(fake.requests()) == 3  # no new request: all hits
    got = load_history(tmp_path / "self-every-3.json").provenance["compaction"]["totals"]
    assert got["latency_s"] == pytest.approx(live) and got["drafts"] == 3
    assert got["cache_hits"] == 3 and got["live_latency_s"] == 0
    assert own.totals["from_cache"]["blocks"] == 0
    assert got["from_cache"]["blocks"] == 3 and got["from_cache"]["latency_s"] == pytest.approx(
        live)
    assert got["prompt_tokens"] == own.totals["prompt_tokens"] > 0
    assert got["cost"] == pytest.approx(own.totals["cost"])
    blocks = load_history(tmp_path / "self-every-3.json").provenance["compaction"]["blocks"]
    assert all(b["cache_hit"] and b["latency_s"] == 0 and b["cached"]["latency_s"] > 0
               and b["cached"]["where"]["arm"] == "self" for b in blocks)
    # what the bench charges the arm as its fork rewrite
    cost = fork_rewrite_cost(load_history(tmp_path / "self-every-3.json"))
    assert cost["fork_rewrite_s"] == pytest.approx(live) and cost["fork_rewrite_requests"] == 3
    assert cost["fork_rewrite_cache_hits"] == 3


@pytest.mark.e2e
def test_another_compressor_setting_does_not_share_entries(fake: FakeProcess,
                                                           tmp_path: Path) -> None:
    fake.reset()
    cache = CompactionCache(tmp_path / "cache.jsonl")
    assert not Compactor(self_compressor(fake.api_url), cache=cache).compact(LONG,
                                                                             "bash").cache_hit
    capped = self_compressor(fake.api_url, max_tokens_per_raw_word=2.0)
    assert not Compactor(capped, cache=cache).compact(LONG, "bash").cache_hit
    assert len(fake.requests()) == 2
    assert Compactor(capped, cache=CompactionCache(tmp_path / "cache.jsonl")).compact(
        LONG, "bash").cache_hit


@pytest.mark.e2e
def test_an_entry_without_its_measured_cost_is_rewritten_not_reused(fake: FakeProcess,
                                                                    tmp_path: Path) -> None:
    fake.reset()
    path = tmp_path / "cache.jsonl"
    config = self_compressor(fake.api_url)
    compactor = Compactor(config, cache=CompactionCache(path))
    key = CompactionCache.key(LONG, "bash", config.identity, compactor.prompt.sha256, False)
    # the line an earlier version wrote: the record, no cost
    path.write_text(json.dumps({"key": key, "record": "old record", "outcome": "rewritten"})
                    + "\n")
    got = Compactor(config, cache=CompactionCache(path)).compact(LONG, "bash")
    assert not got.cache_hit and got.latency_s > 0 and len(fake.requests()) == 1
    hit = Compactor(config, cache=CompactionCache(path)).compact(LONG, "bash")  # the new line
    assert hit.cache_hit and hit.cached is not None
    assert hit.cached["latency_s"] == pytest.approx(got.latency_s)
