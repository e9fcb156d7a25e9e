"""The one client of a server's own endpoints (serve.endpoints): parsing vLLM's /metrics, the
suite's fake engine served in this process, and a port where nothing listens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from compaction_bench.common.net import free_port
from compaction_bench.loadgen.fakeserver import FakeConfig
from compaction_bench.serve.endpoints import (
    EndpointError,
    ServerEndpoints,
    cache_config,
    is_healthy,
    parse_metrics,
    server_version,
)

TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="target"} 3.0
vllm:num_requests_running{engine="1",model_name="target"} 1.0
vllm:num_requests_waiting{engine="0",model_name="target"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="target"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="target"} 2884.0
vllm:prefix_cache_hits_total{engine="0",model_name="target"} 1664.0
vllm:num_preemptions_total{engine="0",model_name="target"} 2.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="target"} 3.5
vllm:request_queue_time_seconds_count{engine="0",model_name="target"} 10.0
vllm:generation_tokens_total{engine="0",model_name="target"} 700.0
vllm:generation_tokens_total{engine="1",model_name="target"} 77.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="target"} 8.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="target"} 2.0
"""
# as vLLM 0.32's CPU build exports it (labels abridged)
CACHE_INFO = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",num_gpu_blocks="1456",prefix_caching_hash_algo="sha256"} 1.0
"""


def test_parse_sums_label_sets() -> None:
    values = parse_metrics(TEXT)
    assert values == {"num_requests_running": 4.0, "num_requests_waiting": 5.0,
                      "kv_cache_usage": 0.25, "prefix_cache_hits": 1664.0,
                      "prefix_cache_queries": 2884.0, "num_preemptions": 2.0,
                      "queue_time_sum_s": 3.5, "queue_time_count": 10.0,
                      "generation_tokens": 777.0, "requests_finished": 10.0,
                      # speculative decoding off: its counters are not exported, so None
                      "spec_decode_drafts": None, "spec_decode_draft_tokens": None,
                      "spec_decode_accepted_tokens": None}
    assert parse_metrics("")["num_requests_waiting"] is None
    # with it on (vLLM 0.32's names, vllm/v1/spec_decode/metrics.py), summed over engines
    spec = parse_metrics(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 40.0\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 120.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 70.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="target"} 2.0\n')
    assert (spec["spec_decode_drafts"], spec["spec_decode_draft_tokens"],
            spec["spec_decode_accepted_tokens"]) == (40.0, 120.0, 72.0)


def test_cache_config_is_the_info_gauge_labels() -> None:
    config = cache_config(TEXT + CACHE_INFO)
    assert config["block_size"] == "128" and config["enable_prefix_caching"] == "True"
    assert config["num_gpu_blocks"] == "1456"
    assert cache_config(TEXT) == {} and cache_config(None) == {}


@pytest.fixture
def fake_url(fake_in_thread: Callable[[FakeConfig], AbstractContextManager[str]]) -> Iterator[str]:
    with fake_in_thread(FakeConfig(models=("target", "compressor"), max_model_len=4096)) as url:
        yield url


def test_what_the_fake_engine_says_about_itself(fake_url: str) -> None:
    with ServerEndpoints(fake_url, timeout_s=5.0) as server:
        assert server.server_url + "/v1" == server.api_url == fake_url
        assert server.healthy() and server.version() == "fake-1"
        models = server.models()
        assert models is not None and [m["id"] for m in models] == ["target", "compressor"]
        assert models[0]["max_model_len"] == 4096
        assert server.metrics()["num_requests_running"] == 0.0
        assert server.cache_config() == {}  # the fake states no cache arguments
        with pytest.raises(EndpointError, match=r"/tokenize answered HTTP 404"):
            server.tokenize_chat("target", [{"role": "user", "content": "hi"}])
        assert server.count_tokens("target", "") == 0 and server.detokenize("target", []) == ""
    assert is_healthy(fake_url) and server_version(fake_url) == "fake-1"


def test_nothing_listening_is_not_stated_or_an_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with ServerEndpoints(url, timeout_s=2.0) as server:
        assert not server.healthy() and server.version() is None and server.models() is None
        assert server.cache_config() == {}
        with pytest.raises(EndpointError, match=rf"scraping {url}/metrics"):
            server.metrics_text()
        with pytest.raises(EndpointError, match=rf"{url}/tokenize: ConnectError"):
            server.tokenize_text("target", "hello")
    assert not is_healthy(url) and server_version(url) is None
