"""What vllm-router 0.1.17 routes each request on, per policy, and its consistent hash in Python.

The fleet model (plan/fleetmodel.py) must split agents over replicas as the router does, so the
router's own hashing is computed here the same way, bit for bit: vllm-router hashes the routing
key with Facebook mcrouter's FurcHash (23-bit modulus), expands the result with MurmurHash64A
(seed 4193360111), and walks a ring of 160 virtual nodes per worker (`"<worker url>:<i>"`, hashed
the same way) to the first node at or after the key's hash, wrapping around. The key of a chat
request that carries `X-Session-Id: S` is the string `header:x-session-id:S`.

Checked against the real router binary (tests/serve/test_routing_keys.py, e2e): fake replicas
behind vllm-router 0.1.17 with `--policy consistent_hash` receive exactly the sessions this
module assigns them. Worker URLs are the strings the router was given (serve.router builds them
with common.net.server_url), since the ring hashes them.

`ROUTING_KEYS` states, per policy the suite offers, what the router keys a chat request on, as
measured on 0.1.17 by the same e2e tests (the manifest records it with the policy).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from compaction_bench.common.net import DEFAULT_PORT

_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
_R = 47
_SEED = 4193360111
_FURC_MODULUS = (1 << 23) - 1
_FURC_SHIFT = 23
_FURC_TRIES = 32
VIRTUAL_NODES = 160
SESSION_KEY = "header:x-session-id:{}"

# per policy: what a chat request is routed on (vllm-router 0.1.17, measured: module docstring)
ROUTING_KEYS = {
    "round_robin": "none: the next replica in turn, request by request",
    "random": "none: a uniformly random replica, request by request",
    "power_of_two": "load: the less loaded of two random replicas (the router's in-flight count)",
    "consistent_hash": "the X-Session-Id header (key 'header:x-session-id:<id>'), hashed onto "
                       "a ring of 160 virtual nodes per replica; the body's session fields are "
                       "not read when the header is present",
    "sticky_least_loaded": "the X-Session-Id header: a session's first request goes to the "
                           "least loaded replica and its later ones follow it",
    "cache_aware": "load, not the prefix: for chat requests 0.1.17 reads neither the prompt "
                   "text nor the X-Session-Id header; a request goes to the replica with the "
                   "fewest in flight (ties: the same one), so an agent's later turn leaves its "
                   "cached prefix whenever that replica is the busier one (a cache_aware run is "
                   "a least-loaded run)",
}
# vllm-router policies the suite does not offer, and why (one line each, for the refusal)
UNSUPPORTED = {
    "kv_aware": "needs the replicas' KV-cache events (--kv-event-source), which the suite does "
                "not wire up",
}


def murmur64a(key: bytes, seed: int = _SEED) -> int:
    """MurmurHash64A (mcrouter lib/fbi/hash.c), as vllm-router computes it."""
    h = (seed ^ ((len(key) * _M) & _MASK)) & _MASK
    whole = len(key) // 8
    for i in range(whole):
        k = (int.from_bytes(key[8 * i:8 * i + 8], "little") * _M) & _MASK
        k ^= k >> _R
        h = ((h ^ ((k * _M) & _MASK)) * _M) & _MASK
    rest = key[8 * whole:]
    if rest:
        for i in range(len(rest) - 1, -1, -1):
            h ^= rest[i] << (8 * i)
        h = (h * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    return h ^ (h >> _R)


def _rehash(k: int) -> int:
    h = (_SEED ^ ((8 * _M) & _MASK)) & _MASK
    k = (k * _M) & _MASK
    k ^= k >> _R
    h = ((h ^ ((k * _M) & _MASK)) * _M) & _MASK
    h ^= h >> _R
    h = (h * _M) & _MASK
    return h ^ (h >> _R)


def furc_hash(key: str, m: int) -> int:
    """FurcHash of `key` into [0, m) (mcrouter), as vllm-router computes it."""
    if m <= 1:
        return 0
    data = key.encode()
    cache: list[int] = []

    def bit(index: int) -> int:
        word = index >> 6
        while len(cache) <= word:
            cache.append(murmur64a(data) if not cache else _rehash(cache[-1]))
        return (cache[word] >> (index & 0x3F)) & 1

    depth = 0
    while m > (1 << depth):
        depth += 1
    a = depth
    for _ in range(_FURC_TRIES):
        while not bit(a):
            if depth == 0:
                return 0
            depth -= 1
            a = depth
        a += _FURC_SHIFT
        number = 1
        for _ in range(max(0, depth - 1)):
            number = (number << 1) | bit(a)
            a += _FURC_SHIFT
        if number < m:
            return number
    return 0


def fbi_hash(key: str) -> int:
    """The router's 64-bit hash of a key (FurcHash, then MurmurHash64A of its 4 LE bytes)."""
    return murmur64a(furc_hash(key, _FURC_MODULUS).to_bytes(4, "little"))


@dataclass(frozen=True)
class HashRing:
    """The router's consistent-hash ring over `urls` (module docstring)."""

    urls: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[int, ...]  # index into urls, per point

    @classmethod
    def of(cls, urls: Sequence[str], virtual_nodes: int = VIRTUAL_NODES) -> HashRing:
        if not urls:
            raise ValueError("a hash ring needs at least one replica URL")
        ring: dict[int, int] = {}
        for i, url in enumerate(urls):
            for v in range(virtual_nodes):
                ring[fbi_hash(f"{url}:{v}")] = i  # a later collision wins, as in a BTreeMap
        points = tuple(sorted(ring))
        return cls(tuple(urls), points, tuple(ring[p] for p in points))

    def replica(self, session_id: str) -> int:
        """The index of the replica the router sends session `session_id` to."""
        at = bisect.bisect_left(self.points, fbi_hash(SESSION_KEY.format(session_id)))
        return self.owners[at % len(self.points)]


def layout_urls(replicas: int, port: int = DEFAULT_PORT,
                host: str = "127.0.0.1") -> tuple[str, ...]:
    """The replica URLs `make serve REPLICAS=n` gives on PORT (serve.replicas: PORT+2+i), which
    a plan assumes where the fleet's own URLs are not known."""
    return tuple(f"http://{host}:{port + 2 + i}" for i in range(replicas))
