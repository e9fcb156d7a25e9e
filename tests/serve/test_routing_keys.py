"""What vllm-router 0.1.17 routes a chat request on, per policy the suite offers, checked against
the real router binary in front of fake replicas (serve/routerhash.py states it; the manifest
records it). The unit tests pin the Python consistent hash to values the e2e test checks."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compaction_bench.common.net import free_port
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.router import (
    ROUTER_POLICIES,
    Router,
    RouterConfig,
    policy_refusal,
    routing_key,
)
from compaction_bench.serve.routerhash import HashRing, fbi_hash, layout_urls

e2e = pytest.mark.e2e


def test_the_hash_is_the_routers_own() -> None:
    # values of the Python port, which the e2e test below checks against the router binary
    assert fbi_hash("header:x-session-id:s1") == fbi_hash("header:x-session-id:s1")
    ring = HashRing.of(layout_urls(2))
    assert len(ring.points) == 320  # 160 virtual nodes per replica, no collision here
    picks = [ring.replica(f"sweep-b{(4 * 10_000 + a) * 10_000 + 1}-clean-original")
             for a in range(8)]
    assert picks == [HashRing.of(layout_urls(2)).replica(
        f"sweep-b{(4 * 10_000 + a) * 10_000 + 1}-clean-original") for a in range(8)]
    counts = collections.Counter(ring.replica(f"s{i}") for i in range(4000))
    assert set(counts) == {0, 1} and min(counts.values()) > 1600  # near-even shares


def test_a_policy_the_suite_does_not_offer_is_refused_in_one_line() -> None:
    assert "kv_aware" not in ROUTER_POLICIES
    line = policy_refusal("kv_aware")
    assert "\n" not in line and "--kv-event-source" in line and "round_robin" in line
    assert "unknown router policy 'nope'" in policy_refusal("nope")
    with pytest.raises(ValueError, match="kv_aware"):
        RouterConfig(worker_urls=("http://127.0.0.1:1",), policy="kv_aware")
    assert "X-Session-Id" in routing_key("consistent_hash")
    assert "load, not the prefix" in routing_key("cache_aware")


@pytest.fixture
def replicas() -> Iterator[list[FakeProcess]]:
    fakes = [FakeProcess(FakeConfig(ttft_ms=1, itl_ms=0, tokens=1)).start() for _ in range(3)]
    try:
        yield fakes
    finally:
        for fake in fakes:
            fake.stop()


def _router(fakes: list[FakeProcess], policy: str, tmp: Path) -> Router:
    router = Router(RouterConfig(worker_urls=tuple(f.server_url for f in fakes), policy=policy,
                                 port=free_port(), metrics_port=free_port()),
                    log_path=tmp / f"router-{policy}.log")
    router.start()
    router.wait_ready()
    return router


def _send(router: Router, text: str, *, session: str | None = None,
          body: dict[str, Any] | None = None, messages: list[dict[str, str]] | None = None,
          fake: dict[str, Any] | None = None) -> None:
    payload: dict[str, Any] = {"model": "target", "max_tokens": 1, **(body or {}),
                               "messages": messages or [{"role": "user", "content": text}]}
    if fake:
        payload["fake"] = fake
    httpx.post(router.config.server_url + "/v1/chat/completions", json=payload,
               headers={"X-Session-Id": session} if session else {}, timeout=30)


def _homes(fakes: list[FakeProcess], prefix: str) -> dict[str, list[int]]:
    """Marker -> the replicas (in arrival order) that received a request whose last user
    message starts with it."""
    homes: dict[str, list[int]] = collections.defaultdict(list)
    for i, fake in enumerate(fakes):
        for body in fake.requests():
            last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
            if last.startswith(prefix):
                homes[last.split()[0]].append(i)
    return homes


@e2e
def test_consistent_hash_routes_on_the_session_header_exactly_as_computed(
        replicas: list[FakeProcess], tmp_path: Path) -> None:
    router = _router(replicas, "consistent_hash", tmp_path)
    try:
        sessions = [f"sweep-b{(6 * 10_000 + a) * 10_000 + k + 1}-external-original"
                    for a in range(12) for k in range(5)]
        for s in sessions:  # a body session field that disagrees is not read
            _send(router, f"{s} hello", session=s, body={"session_params": {"session_id": "x"},
                                                         "user": "u"})
        got = {marker: found[0] for marker, found in _homes(replicas, "sweep-").items()}
        ring = HashRing.of(tuple(f.server_url for f in replicas))
        assert got == {s: ring.replica(s) for s in sessions}
        assert len(set(got.values())) == 3
    finally:
        router.stop()


@e2e
def test_sticky_least_loaded_keys_on_the_session_header(replicas: list[FakeProcess],
                                                         tmp_path: Path) -> None:
    router = _router(replicas, "sticky_least_loaded", tmp_path)
    try:
        for turn in range(4):
            for a in range(9):
                _send(router, f"agent-{a} turn {turn}", session=f"agent-{a}")
        homes = _homes(replicas, "agent-")
        assert all(len(set(h)) == 1 for h in homes.values()), homes  # each session stays
        assert len({h[0] for h in homes.values()}) >= 2, homes  # and sessions spread
    finally:
        router.stop()


@e2e
def test_round_robin_ignores_the_session_header(replicas: list[FakeProcess],
                                                tmp_path: Path) -> None:
    router = _router(replicas, "round_robin", tmp_path)
    try:
        for turn in range(6):
            _send(router, f"agent-0 turn {turn}", session="agent-0")
        assert sorted(collections.Counter(_homes(replicas, "agent-")["agent-0"]).values()
                      ) == [2, 2, 2]
    finally:
        router.stop()


@e2e
def test_cache_aware_routes_chat_by_load_not_by_prefix(replicas: list[FakeProcess],
                                                       tmp_path: Path) -> None:
    """vllm-router 0.1.17's cache_aware with chat requests: unloaded, agents with distinct long
    prefixes all go to one replica (a prefix tree would spread new prefixes); with the replica
    that holds agent A's prefix busy, A's next turn goes to another one (load, not prefix)."""
    router = _router(replicas, "cache_aware", tmp_path)
    try:
        rng = random.Random(7)
        histories = {a: [{"role": "system", "content": " ".join(str(rng.random())
                                                                for _ in range(300))}]
                     for a in range(5)}
        for a, history in histories.items():
            _send(router, "", session=f"agent{a}", messages=[
                *history, {"role": "user", "content": f"agent{a}-turn0 go"}])
        first = _homes(replicas, "agent")
        assert len({h[0] for h in first.values()}) == 1, first  # distinct prefixes, one replica
        home = next(iter(first.values()))[0]
        turn0 = [*histories[0], {"role": "user", "content": "agent0-turn0 go"},
                 {"role": "assistant", "content": "ok"}]
        busy = threading.Thread(target=_send, args=(router, ""), kwargs={
            "messages": [{"role": "user", "content": "busy elsewhere"}],
            "fake": {"ttft_ms": 3000}})
        busy.start()  # unloaded ties go to `home`: this one keeps it busy for 3 s
        try:
            time.sleep(0.5)
            _send(router, "", session="agent0", messages=[
                *turn0, {"role": "user", "content": "agent0-turn1 go"}])
        finally:
            busy.join()
        assert _homes(replicas, "busy")["busy"] == [home]
        assert _homes(replicas, "agent0-turn1")["agent0-turn1"][0] != home  # load, not prefix
    finally:
        router.stop()
