"""Cache-break accounting: for every arm request, the prefix-cache hit its rendered prompt
predicts, beside the `cached_tokens` the server measured, and the cached text each policy throws
away by rewriting what was already sent.

From the records alone (a pure function of the run folder). Each arm request carries its
prompt's and completion's token ids as 16-token unit hashes (`transport.prefixhash`, vLLM's
`return_token_ids`). The server's KV block size B comes from the self-check (the server's own
cache_config), else the profile, else vLLM's default 16. The server caches full B-token blocks:

- a request's prompt blocks, floor(n / B) · B tokens, once its prefill is done (its first token);
- its prompt and completion, floor((n + m - 1) / B) · B tokens, once it has ended (the last
  sampled token is never fed back, so its KV is never computed);
- a cache salt (`CACHE=isolated`) keeps a request to its own salt's blocks.

A request's predicted hit is the longest run of its prompt's leading blocks found in that cache,
capped at floor((n - 1) / B) · B (vLLM recomputes the last prompt token). `predicted_low` counts
what was surely cached when the request was sent; `predicted_high` also what other requests
(arms running side by side) sent before this one's first token came may have cached (their
prompts, whose blocks the server caches when their prefill ends, before the client sees their
first token, and their replies, cached block by block as they are generated), so the two
differ only where requests overlapped. A request agrees when the measured hit lies within one
block of [low, high]. Eviction, and anything cached before the run (by earlier runs, other
users of a shared server, background load that records no ids), is outside the prediction: a
request the run's own records cannot explain is listed with its request id, never dropped, and
marked *warmer* (more cached than predicted: what a shared cache held before the run; `CACHE=run`
starts cold) or *colder* (less: evicted, or a misprediction).

Cache loss, per request after an attempt's first: `reusable` is what the arm's own previous
request left cached (capped by this prompt), `break_token` the first token (to 16) where this
prompt departs from the previous prompt and completion, and loss = reusable - the blocks below
the break (predicted) or - the measured hit (measured). A break before the previous prompt's
last unit is in *old text* (a policy rewrote history it had already sent); from there on, in
the *previous reply* (the reply re-rendered, rewritten as the step just completed, or dropped
after a format error; the last unit holds the generation prompt the reply was written after).

Behind a router each replica has a cache of its own: a request's prediction counts only what
requests on the same replica cached (each request's replica from the replicas' counters,
`bench.analysis.replicas.request_replicas`); a request whose replica is not known is listed as
not checked and fills no cache, so a later request on its replica may read *warmer*. The
predicted loss is then the policy's own (where the prompt departs from the previous one); the
measured loss also holds what the router cost by sending the request to another replica.

A block run again (`block_pass` 2+ after RESUME) is accounted from one pass, the one the primary
analysis counts (the last closed by a block record, `paired.block_statuses`): the original
attempts' requests of its other passes still fill the predicted cache (the server did cache
them, each under its own pass's salt) but get no row, add to no sum and are listed as not
checked, so no figure mixes two passes.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction_bench.bench.analysis.replicas import request_replicas
from compaction_bench.bench.runfolder import (
    REFERENCE_ARM,
    RunRecords,
    arm_sort_key,
    regime_sort_key,
)
from compaction_bench.transport.client import RequestRecord
from compaction_bench.transport.prefixhash import common_prefix

DEFAULT_BLOCK = 16  # vLLM's default KV block size, where neither server nor profile says


@dataclass(frozen=True)
class RequestCache:
    """One arm request's predicted and measured prefix-cache hit (module docstring)."""

    request_id: str
    regime: str
    block: int
    arm: str
    attempt: str
    index: int  # the request's place in its attempt (0: the first postfork request)
    prompt_tokens: int
    measured: int
    predicted_low: int
    predicted_high: int
    break_token: int | None = None
    break_region: str | None = None  # old text | previous reply
    reusable: int | None = None
    loss_predicted: int | None = None
    loss_measured: int | None = None
    agrees: bool = True
    exact: bool = True
    # a disagreement's direction: "warmer" (more cached than the run's own requests explain:
    # cached before the run, by earlier runs or other users of a shared cache) or "colder"
    # (less than they left: evicted, or mispredicted); None where it agrees
    disagreement: str | None = None


@dataclass(frozen=True)
class ArmCache:
    """One arm's requests in one regime, summed."""

    regime: str
    arm: str
    n_requests: int  # arm requests in the regime
    n_checked: int  # with token ids, ok, not truncated
    n_agree: int
    n_exact: int
    prompt_tokens: int
    measured: int
    predicted_low: int
    predicted_high: int
    loss_predicted: int
    loss_measured: int
    loss_old_text: int  # predicted loss where the break fell before the last reply
    added_vs_clean: tuple[float, ...]  # per block: this arm's measured loss minus clean's

    @property
    def added_vs_clean_median(self) -> float | None:
        return float(np.median(self.added_vs_clean)) if self.added_vs_clean else None


@dataclass(frozen=True)
class CacheAccounting:
    block_size: int
    block_source: str  # server | profile | default
    requests: tuple[RequestCache, ...]
    arms: tuple[ArmCache, ...]
    unchecked: tuple[tuple[str, str, str], ...]  # (request id, arm, why not checked)
    per_replica: bool = False  # behind a router: one predicted cache per replica

    @property
    def disagreements(self) -> tuple[RequestCache, ...]:
        return tuple(r for r in self.requests if not r.agrees)


def kv_block_size(manifest: Mapping[str, Any]) -> tuple[int, str]:
    """(B, where it came from): the self-check's server cache_config, the profile, 16."""
    def as_int(value: Any) -> int | None:
        try:
            found = int(value)
        except (TypeError, ValueError):
            return None
        return found if found > 0 else None

    selfcheck = manifest.get("selfcheck")
    config = selfcheck.get("cache_config") if isinstance(selfcheck, dict) else None
    if isinstance(config, dict) and (found := as_int(config.get("block_size"))):
        return found, "server"
    server = manifest.get("server")
    profile = server.get("profile") if isinstance(server, dict) else None
    engine = profile.get("engine_args") if isinstance(profile, dict) else None
    if isinstance(engine, dict) and (found := as_int(engine.get("block_size"))):
        return found, "profile"
    return DEFAULT_BLOCK, "default"


@dataclass(frozen=True)
class _Prompt:
    record: RequestRecord
    arm: str
    attempt: str
    domain: str
    n: int
    m: int
    unit: int
    hashes: tuple[str, ...]
    counted: bool = True  # False: a pass the analysis does not count (it only fills the cache)

    def boundaries(self, length: int, block: int) -> list[tuple[int, str]]:
        """(position, hash) of every B-block boundary up to `length` tokens."""
        out = []
        for end in range(block, length + 1, block):
            index = end // self.unit - 1
            if index >= len(self.hashes):
                break
            out.append((end, self.hashes[index]))
        return out


SUPERSEDED = ("a pass of a block run again that the analysis does not count (it counts the "
              "last pass a block record closed)")


def _pass(value: Any) -> int:
    """A `block_pass` as recorded (None or absent: 1)."""
    try:
        return int(value) if value is not None else 1
    except (TypeError, ValueError):
        return 1


def counted_passes(records: RunRecords) -> dict[tuple[str, int], int]:
    """The pass of every block whose original attempts count: the last one a block record
    closed, else the last with an arm record (the rule of `paired.block_statuses`), else the
    last any request names."""
    out: dict[tuple[str, int], int] = {}
    for r in records.requests:
        if r.block is not None:
            key = (r.regime, r.block)
            out[key] = max(out.get(key, 0), _pass(r.labels.get("block_pass")))
    armed: dict[tuple[str, int], int] = {}
    for a in records.arms:
        armed[(a.regime, a.block)] = max(armed.get((a.regime, a.block), 0), a.block_pass or 1)
    closed: dict[tuple[str, int], int] = {}
    for b in records.blocks:
        closed[(b.regime, b.block)] = max(closed.get((b.regime, b.block), 0), b.block_pass or 1)
    return {**out, **armed, **closed}


UNROUTED = ("behind a router, its replica is not known (it did not end alone between two "
            "scrapes of the replicas' counters)")


def _prompts(records: RunRecords, arms: Sequence[str], block: int,
             replicas: Mapping[str, str | None] | None = None
             ) -> tuple[list[_Prompt], list[tuple[str, str, str]], dict[str, int]]:
    # each pass of a block has its own salt under CACHE=isolated: key the domain by pass too
    salts = {(a.regime, a.block, a.arm, a.attempt, a.block_pass or 1): a.cache_salt or ""
             for a in records.arms}
    passes = counted_passes(records)
    found, unchecked = [], []
    totals: dict[str, int] = defaultdict(int)
    for r in records.requests:
        if r.source not in arms or r.block is None:
            continue
        label = r.labels.get("kv_prefix")
        attempt = str(r.labels.get("attempt", "original"))
        pass_ = _pass(r.labels.get("block_pass"))
        counted = attempt != "original" or pass_ == passes.get((r.regime, r.block), pass_)
        if counted:
            totals[f"{r.regime}\0{r.source}"] += 1
        else:
            unchecked.append((r.request_id, r.source, SUPERSEDED))
        if r.status != "ok" or r.cached_tokens is None or r.prompt_tokens is None:
            if counted:
                unchecked.append((r.request_id, r.source, "failed or without usage"))
            continue
        why = None
        if not isinstance(label, dict) or not isinstance(label.get("hashes"), list):
            why = "no token ids (TOKEN_IDS=0, or a server without return_token_ids)"
        else:
            unit, n = int(label.get("unit") or 0), int(label.get("prompt") or 0)
            if unit <= 0 or block % unit:
                why = f"hash unit {unit} does not divide the KV block size {block}"
            elif n != r.prompt_tokens:
                why = (f"prompt truncated or altered: {n} ids returned, usage says "
                       f"{r.prompt_tokens}")
        if why is not None:
            if counted:
                unchecked.append((r.request_id, r.source, why))
            continue
        assert isinstance(label, dict)
        domain = salts.get((r.regime, r.block, r.source, attempt, pass_), "")
        if replicas is not None:  # one cache per replica behind a router
            replica = replicas.get(r.request_id)
            if replica is None:
                if counted:
                    unchecked.append((r.request_id, r.source, UNROUTED))
                continue
            domain = f"{domain}@{replica}"
        found.append(_Prompt(r, r.source, f"{attempt}#{pass_}", domain, n,
                             int(label.get("completion") or 0), unit,
                             tuple(str(h) for h in label["hashes"]), counted))
    return found, unchecked, totals


def _hit(prompt: _Prompt, cached: set[tuple[int, str]], block: int) -> int:
    cap = max(prompt.n - 1, 0) // block * block
    hit = 0
    for end, digest in prompt.boundaries(cap, block):
        if (end, digest) not in cached:
            break
        hit = end
    return hit


def _sweep(group: list[_Prompt], block: int, *, upper: bool) -> dict[int, int]:
    """Predicted hit per request (index into `group`), from one pass over time; queries come
    before additions at equal times. Lower bound: a request is queried when sent, another's
    prompt counts once its first token came and its reply once it ended. Upper bound: queried at
    its own first token, another's prompt and whole reply count from the moment that one was
    sent: the server caches a prompt's blocks when its prefill ends, which can be any time after
    it was sent and comes before the client sees its first token (a CI run found a side-by-side
    arm's fork request fully cached by another arm's identical one whose first token the client
    saw later), and a reply's blocks while it is generated."""
    events: list[tuple[float, int, int]] = []  # (time, 0 query / 1 prompt / 2 reply, index)
    for index, p in enumerate(group):
        r = p.record
        first = r.first_token_s if r.first_token_s is not None else r.end_s or r.sent_s
        events += [(first if upper else r.sent_s, 0, index),
                   (r.sent_s if upper else first, 1, index),
                   (r.sent_s if upper else (r.end_s or first), 2, index)]
    heapq.heapify(events)
    cached: set[tuple[int, str]] = set()
    # the upper bound adds a request's own blocks before its own query: who added each block, so
    # a request never finds only its own blocks
    adders: dict[tuple[int, str], set[int]] = defaultdict(set)
    out: dict[int, int] = {}
    while events:
        _, kind, index = heapq.heappop(events)
        p = group[index]
        if kind == 0:
            others = cached if not upper else {b for b in cached if adders[b] - {index}}
            out[index] = _hit(p, others, block)
        else:
            length = p.n if kind == 1 else p.n + p.m - 1
            added = p.boundaries(length // block * block, block)
            cached.update(added)
            for boundary in added:
                adders[boundary].add(index)
    return out


def _predictions(prompts: list[_Prompt], block: int) -> dict[str, tuple[int, int]]:
    """(low, high) predicted hit per request id, per cache domain (salt)."""
    out: dict[str, tuple[int, int]] = {}
    by_domain: dict[str, list[_Prompt]] = defaultdict(list)
    for p in prompts:
        by_domain[p.domain].append(p)
    for group in by_domain.values():
        low, high = _sweep(group, block, upper=False), _sweep(group, block, upper=True)
        for index, p in enumerate(group):
            out[p.record.request_id] = (low[index], max(low[index], high[index]))
    return out


def cache_accounting(records: RunRecords, arms: Sequence[str]) -> CacheAccounting:
    """Every arm request's predicted and measured hit, and each arm's cache loss (per replica
    behind a router: module docstring)."""
    block, source = kv_block_size(records.manifest)
    replicas = request_replicas(records)
    prompts, unchecked, totals = _prompts(records, arms, block, replicas)
    predicted = _predictions(prompts, block)
    attempts: dict[tuple[str, int, str, str], list[_Prompt]] = defaultdict(list)
    for p in prompts:
        if p.counted:  # another pass's requests filled the cache above, and count no further
            attempts[(p.record.regime, p.record.block or 0, p.arm, p.attempt)].append(p)
    rows: list[RequestCache] = []
    for (regime, number, arm, attempt), group in attempts.items():
        group.sort(key=lambda p: p.record.sent_s)
        for index, p in enumerate(group):
            low, high = predicted[p.record.request_id]
            measured = int(p.record.cached_tokens or 0)
            extra: dict[str, Any] = {}
            if index:
                prev = group[index - 1]
                cap = max(p.n - 1, 0) // block * block
                shared = common_prefix(p.hashes[: p.n // p.unit], prev.hashes) * p.unit
                reusable = min(max(prev.n + prev.m - 1, 0) // block * block, cap)
                own = min(shared // block * block, reusable)
                extra = {"break_token": shared, "reusable": reusable,
                         # the first differing token lies in [shared, shared + unit); the
                         # last unit of the previous prompt (its generation prompt, e.g.
                         # "<|im_start|>assistant\n") counts as the reply's
                         "break_region": "old text" if shared + 2 * p.unit <= prev.n
                         else "previous reply",
                         "loss_predicted": reusable - own,
                         "loss_measured": max(0, reusable - measured)}
            rows.append(RequestCache(
                request_id=p.record.request_id, regime=regime, block=number, arm=arm,
                attempt=attempt.split("#")[0], index=index, prompt_tokens=p.n,
                measured=measured, predicted_low=low, predicted_high=high,
                agrees=low - block <= measured <= high + block,
                exact=low <= measured <= high,
                disagreement="warmer" if measured > high + block
                else "colder" if measured < low - block else None, **extra))
    rows.sort(key=lambda r: (regime_sort_key(r.regime), r.block, arm_sort_key(r.arm), r.index))
    return CacheAccounting(block, source, tuple(rows), _summaries(rows, totals),
                           tuple(unchecked), per_replica=replicas is not None)


def _summaries(rows: list[RequestCache], totals: Mapping[str, int]) -> tuple[ArmCache, ...]:
    loss: dict[tuple[str, str, int], int] = defaultdict(int)
    for r in rows:
        if r.attempt == "original":
            loss[(r.regime, r.arm, r.block)] += r.loss_measured or 0
    out = []
    keys = sorted({(r.regime, r.arm) for r in rows},
                  key=lambda k: (regime_sort_key(k[0]), arm_sort_key(k[1])))
    for regime, arm in keys:
        own = [r for r in rows if (r.regime, r.arm) == (regime, arm)]
        blocks = sorted({r.block for r in own if r.attempt == "original"})
        added = tuple(float(loss[(regime, arm, b)] - loss[(regime, REFERENCE_ARM, b)])
                      for b in blocks if (regime, REFERENCE_ARM, b) in loss)
        out.append(ArmCache(
            regime=regime, arm=arm, n_requests=totals.get(f"{regime}\0{arm}", len(own)),
            n_checked=len(own), n_agree=sum(r.agrees for r in own),
            n_exact=sum(r.exact for r in own), prompt_tokens=sum(r.prompt_tokens for r in own),
            measured=sum(r.measured for r in own),
            predicted_low=sum(r.predicted_low for r in own),
            predicted_high=sum(r.predicted_high for r in own),
            loss_predicted=sum(r.loss_predicted or 0 for r in own),
            loss_measured=sum(r.loss_measured or 0 for r in own),
            loss_old_text=sum(r.loss_predicted or 0 for r in own
                              if r.break_region == "old text"),
            added_vs_clean=() if arm == REFERENCE_ARM else added))
    return tuple(out)
