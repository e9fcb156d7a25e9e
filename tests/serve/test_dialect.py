"""The engine's request extras, written once (serve/engines/vllm_wire.py)."""

from __future__ import annotations

from compaction_bench.serve.engines import vllm_wire as dialect


def test_each_extra_is_the_field_vllm_reads() -> None:
    assert dialect.cache_salt("run-1") == {"cache_salt": "run-1"} and dialect.cache_salt(None) == {}
    assert dialect.length(7) == {"max_tokens": 7, "ignore_eos": True}
    assert dialect.length(7, exact=True) == {"max_tokens": 7, "min_tokens": 7, "ignore_eos": True}
    assert dialect.token_ids() == {"return_token_ids": True}
    assert dialect.special_tokens_as_text() == {"skip_special_tokens": False}
