"""The fake server's engine mode (loadgen.fakeengine): its timing is the stated capacity model to
within scheduling noise, its prefix cache counts and evicts exactly, and bad flags are refused
in one line. Timing bounds: never earlier than the model (the client's send stamp precedes the
server's arrival), at most `LATE_S` later (a busy 2-core machine's wake-up and loopback)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from compaction_bench.common.net import free_port
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.endpoints import cache_config
from compaction_bench.serve.launcher import ServerConfig
from compaction_bench.serve.profile import load_profile
from compaction_bench.serve.replicas import Fleet, FleetConfig
from compaction_bench.transport.client import StreamClient, prepare, send_once
from compaction_bench.transport.request import RequestRecord

pytestmark = pytest.mark.e2e

EARLY_S, LATE_S = 0.002, 0.030
# P = 0.5 ms a token, D = 0.5, a step of B sequences 10 + 5 B ms, blocks of K = 4 tokens
P, D, S, Q, K = 0.5, 0.5, 10.0, 5.0, 4
ENGINE: dict[str, Any] = dict(engine="steps", prefill_ms_per_token=P, cache_discount=D, step_ms=S,
              step_ms_per_seq=Q, block_tokens=K)


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(max_running=2, **ENGINE)) as server:
        yield server


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _ask(server: FakeProcess, text: str, tokens: int, salt: str | None = None,
         **extra: Any) -> RequestRecord:
    """One streamed request; its cache salt is its text unless given, so that prompts of
    different tests share no block (they all begin with the same JSON)."""
    body: dict[str, Any] = {"model": "target", "max_tokens": tokens,
                            "messages": _messages(text), "cache_salt": salt or text, **extra}
    client = StreamClient()
    try:
        record = client.send(prepare(server.api_url, body, request_id=text[:8])).record
    finally:
        client.close()
    assert record.ok, record.error
    return record


def _prompt(text: str) -> tuple[str, int]:
    serialized = json.dumps(_messages(text))
    return serialized, max(1, len(serialized) // 4)


def _prefill_s(prompt: int, cached: int) -> float:
    return (P * (prompt - cached) + (1 - D) * P * cached) / 1000


def _step_s(batch: int) -> float:
    return (S + Q * batch) / 1000


def _near(measured: float, model: float) -> None:
    assert model - EARLY_S <= measured <= model + LATE_S, (measured, model)


def _hit_tokens(cached: str, serialized: str, k: int = K) -> int:
    """What a serialized prompt finds after `cached` was prefilled: k x the leading full blocks
    they share, at most (prompt_tokens - 1) // k blocks (one token is always computed)."""
    prompt = max(1, len(serialized) // 4)
    width, n = 4 * k, 0
    while (n + 1) * width <= min(len(cached), len(serialized)) and \
            cached[:(n + 1) * width] == serialized[:(n + 1) * width]:
        n += 1
    return k * min(n, (prompt - 1) // k)


def test_a_request_alone_takes_its_prefill_then_its_steps(engine: FakeProcess) -> None:
    text = "alone " * 80
    _, prompt = _prompt(text)
    r = _ask(engine, text, 11)
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (prompt, 0, 11)
    assert r.first_token_s is not None and r.end_s is not None
    _near(r.first_token_s - r.sent_s, _prefill_s(prompt, 0))
    _near(r.end_s - r.sent_s, _prefill_s(prompt, 0) + 10 * _step_s(1))
    # the first token alone, then at most one chunk per 50 ms of engine time, and the last
    assert len(r.chunk_times_s) <= 2 + int(10 * _step_s(1) / 0.05)
    assert r.text_chars == len("tok " * 11)
    scripted = _ask(engine, "scripted " * 40, 50, fake={"content": "one two three"})
    assert scripted.completion_tokens == 3 and scripted.finish_reason == "stop"
    plain = httpx.post(engine.api_url + "/chat/completions", timeout=10, json={
        "model": "target", "max_completion_tokens": 7, "messages": _messages("x" * 99)}).json()
    assert plain["usage"]["completion_tokens"] == 7
    assert plain["choices"][0]["message"]["content"] == "tok " * 7


def test_a_shared_prefix_is_cached_and_prefills_faster(engine: FakeProcess) -> None:
    before = engine.stats()["engine"]
    base = "prefix " * 300
    first = _ask(engine, base, 2, salt="shared")
    text = base + "and then some more " * 20
    _, prompt = _prompt(text)
    second = _ask(engine, text, 2, salt="shared")
    hit = _hit_tokens(_prompt(base)[0], _prompt(text)[0])
    assert hit > 400 and second.cached_tokens == hit
    assert second.first_token_s is not None and first.cached_tokens == 0
    _near(second.first_token_s - second.sent_s, _prefill_s(prompt, hit))
    # the same prompt under a new salt hits nothing: the TTFT grows back by D * P * cached
    fresh = _ask(engine, text, 2, salt="other")
    assert fresh.cached_tokens == 0 and fresh.first_token_s is not None
    _near(fresh.first_token_s - fresh.sent_s, _prefill_s(prompt, 0))
    saved = (fresh.first_token_s - fresh.sent_s) - (second.first_token_s - second.sent_s)
    assert abs(saved - D * P * hit / 1000) <= LATE_S
    again = _ask(engine, text, 2, salt="other")  # within one salt the cache works
    assert again.cached_tokens == _hit_tokens(_prompt(text)[0], _prompt(text)[0]) > hit
    after = engine.stats()["engine"]
    assert after["cached_tokens"] - before["cached_tokens"] == hit + again.cached_tokens
    metrics = httpx.get(engine.server_url + "/metrics", timeout=10).text
    assert f'vllm:prefix_cache_hits_total{{model_name="target"}} {after["cached_tokens"]:.1f}' \
        in metrics
    assert cache_config(metrics)["block_size"] == str(K)


def test_one_slot_serializes_two_requests() -> None:
    with FakeProcess(FakeConfig(max_running=1, **ENGINE)) as fake:
        texts = ["first " * 60, "second " * 60]
        got: dict[int, RequestRecord] = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, _ask(
            fake, texts[i], 6))) for i in range(2)]
        threads[0].start()
        time.sleep(0.01)  # during the first one's prefill
        threads[1].start()
        for t in threads:
            t.join()
        a, b = got[0], got[1]
        assert a.end_s is not None and b.first_token_s is not None and b.end_s is not None
        a_end = a.sent_s + _prefill_s(_prompt(texts[0])[1], 0) + 5 * _step_s(1)
        _near(a.end_s, a_end)
        # the second waits for the first to end, then has the engine alone
        b_first = a_end + _prefill_s(_prompt(texts[1])[1], 0)
        _near(b.first_token_s, b_first)
        _near(b.end_s, b_first + 5 * _step_s(1))


def test_a_step_costs_more_with_every_running_sequence(engine: FakeProcess) -> None:
    # a gate (one token, a long prefill) holds the engine while the two arrive, so both are
    # admitted at its end and run every step together
    gate_text, texts = "gate " * 400, ["pair one " * 30, "pair two " * 30]
    got: dict[str, RequestRecord] = {}
    threads = [threading.Thread(target=lambda t=t, n=n: got.__setitem__(t, _ask(
        engine, t, n))) for t, n in [(gate_text, 1), (texts[0], 9), (texts[1], 9)]]
    threads[0].start()
    time.sleep(0.1)  # inside the gate's prefill of about 0.25 s
    threads[1].start()
    threads[2].start()
    for t in threads:
        t.join()
    gate, a, b = got[gate_text], got[texts[0]], got[texts[1]]
    assert gate.end_s is not None and a.end_s is not None and b.end_s is not None
    gate_end = gate.sent_s + _prefill_s(_prompt(gate_text)[1], 0)
    _near(gate.end_s, gate_end)
    prefills = sum(_prefill_s(_prompt(t)[1], 0) for t in texts)
    both_end = gate_end + prefills + 8 * _step_s(2)
    _near(a.end_s, both_end)
    _near(b.end_s, both_end)
    # against one alone: 8 steps of S + Q
    text = "single " * 30
    alone = _ask(engine, text, 9)
    assert alone.end_s is not None
    _near(alone.end_s - alone.sent_s, _prefill_s(_prompt(text)[1], 0) + 8 * _step_s(1))


def test_an_abandoned_request_leaves_the_engine_and_fixed_timing_bypasses_it(
        engine: FakeProcess) -> None:
    before = engine.stats()["engine"]
    with httpx.stream("POST", engine.api_url + "/chat/completions", timeout=10, json={
            "model": "target", "max_tokens": 500, "stream": True,
            "messages": _messages("abandoned")}) as response:
        next(response.iter_lines())  # its first token, then the client goes away
    fixed = _ask(engine, "fixed timing", 3, fake={"ttft_ms": 5, "itl_ms": 1})
    assert fixed.completion_tokens == 3
    _ask(engine, "after it", 2)
    deadline = time.monotonic() + 2
    while (after := engine.stats()["engine"])["running"] and time.monotonic() < deadline:
        time.sleep(0.02)  # the abandoned one's handler notices at its next chunk (50 ms)
    assert after["requests"] == before["requests"] + 2  # the abandoned one and "after it"
    assert after["steps"] - before["steps"] < 100  # not the abandoned one's 499
    assert (after["running"], after["waiting"]) == (0, 0)


def test_the_cache_evicts_the_least_recently_used_blocks() -> None:
    text_x, text_y = "x" * 400, "y" * 400
    blocks = len(_prompt(text_x)[0]) // (4 * K)  # both prompts: 27 blocks
    capacity = 40
    config = FakeConfig(cache_tokens=capacity * K, **ENGINE)
    with FakeProcess(config) as fake:
        assert _ask(fake, text_x, 1).cached_tokens == 0
        whole = _hit_tokens(_prompt(text_x)[0], _prompt(text_x)[0])
        assert _ask(fake, text_x, 1).cached_tokens == whole
        assert _ask(fake, text_y, 1).cached_tokens == 0
        # y's blocks pushed out the least recent of x's: its tail (a prompt's blocks are
        # refreshed last to first), so x keeps a shorter prefix
        assert _ask(fake, text_x, 1).cached_tokens == K * (capacity - blocks)
        metrics = httpx.get(fake.server_url + "/metrics", timeout=10).text
        assert cache_config(metrics)["num_gpu_blocks"] == str(capacity)
        assert fake.stats()["engine"]["cache_blocks"] == capacity


@pytest.mark.parametrize(("flags", "says"), [
    (["--cache-discount", "1.5"], "--cache-discount 1.5: must be in [0, 1]"),
    (["--block-tokens", "0"], "--block-tokens 0: must be >= 1"),
    (["--cache-tokens", "8"], "--cache-tokens 8: must be 0 (unlimited) or at least one block"),
    (["--step-ms", "-1"], "--step-ms -1.0: must be a finite number of ms >= 0"),
    (["--engine", "vllm"], "--engine vllm: must be none"),
])
def test_bad_engine_flags_are_refused_in_one_line(flags: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "compaction_bench.loadgen.fakeserver",
                           "--port", "0", "--engine", "steps", *flags],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def _free_block() -> int:
    """A port P with P + 2, P + 3 (the replicas) and P + 1000 (the router's Prometheus) free."""
    for _ in range(50):
        port = int(free_port())
        if port + 1000 > 65535:
            continue
        try:
            for p in (port + 2, port + 3, port + 1000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no block of free ports")


def _turn() -> list[dict[str, str]]:
    return [{"role": "assistant", "content": "tok tok tok "},
            {"role": "user", "content": "next " * 50}]


def test_the_fake_fleet_profile_serves_replicas_with_their_own_caches() -> None:
    """`make serve PROFILE=fake-fleet REPLICAS=2 ROUTER_POLICY=consistent_hash`, as the library
    starts it: each agent's second turn lands on its replica and finds its first turn cached."""
    fleet = Fleet(FleetConfig(server=ServerConfig(profile=load_profile("fake-fleet"),
                                                  port=_free_block()),
                              replicas=2, policy="consistent_hash"))
    fleet.start()
    try:
        cached, expected = {}, {}
        for agent in range(6):
            history = _messages(f"agent {agent}: " + "work " * 200)
            expected[agent, 0] = 0
            expected[agent, 1] = _hit_tokens(json.dumps(history), json.dumps([
                *history, *_turn()]), 16)
            for turn in range(2):
                got = send_once(fleet.api_url, {"model": "target", "max_tokens": 3,
                                                "messages": history},
                                request_id=f"a{agent}t{turn}", session_id=f"agent-{agent}")
                assert got.record.ok and got.record.completion_tokens == 3, got.record.error
                cached[agent, turn] = got.record.cached_tokens
                history = [*history, *_turn()]
        assert cached == expected
        assert all(expected[a, 1] >= 200 for a in range(6))
        hits = 0.0
        for server in fleet.servers:
            metrics = httpx.get(server.server_url + "/metrics", timeout=10).text
            assert cache_config(metrics) == {"block_size": "16", "enable_prefix_caching": "True",
                                             "num_gpu_blocks": str(10**9)}
            hits += next(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("vllm:prefix_cache_hits_total"))
        assert hits == sum(cached.values())
    finally:
        fleet.stop()
