"""Prompt and completion token ids kept as 16-token unit hashes: what they say about a shared
prefix, and how the client takes them from vLLM's stream (`return_token_ids`)."""

from __future__ import annotations

import json

from compaction_bench.transport.client import StreamClient, prepare
from compaction_bench.transport.prefixhash import UNIT, common_prefix, prefix_label, unit_hashes


def test_unit_hashes_are_chained_and_say_how_much_two_sequences_share() -> None:
    a = list(range(100))
    assert len(unit_hashes(a)) == 100 // UNIT  # a trailing partial unit gets no hash
    b = [*a[:37], -1, *a[38:]]  # first difference at token 37: units 0 and 1 shared
    assert common_prefix(unit_hashes(a), unit_hashes(b)) == 2
    c = [-1, *a[1:]]  # a difference in the first unit changes every later (chained) hash
    assert all(x != y for x, y in zip(unit_hashes(a), unit_hashes(c), strict=True))
    assert common_prefix(unit_hashes(a), unit_hashes(a[:64])) == 4
    assert all(len(h) == 8 for h in unit_hashes(a))


def test_prompt_and_completion_hash_as_one_sequence() -> None:
    label = prefix_label(list(range(20)), list(range(20, 40)))
    assert (label["unit"], label["prompt"], label["completion"]) == (16, 20, 20)
    assert label["hashes"] == unit_hashes(list(range(40)))


def _chunk(body: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def test_the_client_keeps_vllm_token_ids_as_a_label() -> None:
    prompt = list(range(1, 40))
    reads = [_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                     "prompt_token_ids": prompt}),
             _chunk({"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7]}]}),
             _chunk({"choices": [{"index": 0, "delta": {"content": "!"}, "token_ids": [8],
                                  "finish_reason": "stop"}]}),
             _chunk({"choices": [], "usage": {"prompt_tokens": 39, "completion_tokens": 2}}),
             b"data: [DONE]\n\n"]
    request = prepare("http://scripted.invalid/v1", {"model": "m", "messages": [],
                                                     "return_token_ids": True}, request_id="s")
    record = StreamClient().decode(reads, request).record
    assert record.status == "ok" and record.labels["kv_prefix"] == prefix_label(prompt, [7, 8])
    plain = StreamClient().decode([_chunk({"choices": [{"index": 0, "delta": {"content": "x"}}]}),
                                   b"data: [DONE]\n\n"], request).record
    assert "kv_prefix" not in plain.labels  # no ids asked for or sent: no label
