"""The fake server's engine mode (`--engine steps`): a capacity model known exactly, with a
prefix cache per server process, so a fleet of fakes behind a router has a computable truth.

The model, on the event loop's monotonic clock (all costs in ms, C = `--max-running`):

- A request arrives when its body is read and waits FIFO.
- At each step boundary t the engine admits waiting requests that arrived by t, in order, while
  fewer than C run (C = 0: no limit). When nothing runs and nothing is due, it idles and starts
  again at the next request's arrival time.
- The admitted ones are prefilled one after another, the engine doing nothing else meanwhile.
  A prefill looks the prompt up in the cache at its start, costs P * uncached + (1 - D) * P *
  cached, yields the request's first token at its end, and then inserts the prompt's blocks.
- Then every running sequence (B of them, the just admitted included) decodes one token in a
  step of S + Q * B. A request leaves when it has its N completion tokens: N - 1 steps after its
  prefill (N = 1: at the end of the prefill).

So a request alone takes P * uncached + (1 - D) * P * cached to its first token and
(N - 1) * (S + Q) more to its last. Every due time is absolute (a step is due at the previous
step's due end), so a late wake-up never shifts the schedule.

The prefix cache: the prompt is the JSON of the messages (`json.dumps`, its token count
`max(1, len // 4)`, as without the engine), cut into blocks of 4 * K characters (K =
`--block-tokens`, a block = K tokens). Block hashes are chained (sha256 of the previous hash and
the block's text), the chain seeded with the request's `cache_salt`, so different salts never
share a block (vLLM's semantics; the salt adds no tokens). Cached tokens = K * the number of
leading full blocks present, at most (prompt_tokens - 1) // K blocks: at least one prompt token
is always computed, as in vLLM. After a prefill every full block of the prompt is inserted (or
refreshed), last block first, so that within a prompt the tail is evicted before the head; with
`--cache-tokens` T > 0 the cache holds T // K blocks and evicts the least recently used.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

# At most one chunk per this much engine time after a request's first token (plus its last).
FLUSH_S = 0.05
UNLIMITED_BLOCKS = 10**9  # vllm:cache_config_info's num_gpu_blocks when the cache is unlimited


@dataclass(frozen=True)
class StepModel:
    """The engine's costs and sizes (module docstring); `problems()` names every bad value."""

    max_running: int = 0  # C
    prefill_ms_per_token: float = 0.2  # P
    cache_discount: float = 1.0  # D
    step_ms: float = 2.0  # S
    step_ms_per_seq: float = 0.25  # Q
    block_tokens: int = 16  # K
    cache_tokens: int = 0  # T

    def problems(self) -> list[str]:
        out = []
        if self.max_running < 0:
            out.append(f"--max-running {self.max_running}: must be >= 0 (0: no limit)")
        for flag, value in (("--prefill-ms-per-token", self.prefill_ms_per_token),
                            ("--step-ms", self.step_ms),
                            ("--step-ms-per-seq", self.step_ms_per_seq)):
            if not (math.isfinite(value) and value >= 0):
                out.append(f"{flag} {value}: must be a finite number of ms >= 0")
        if not (0.0 <= self.cache_discount <= 1.0):
            out.append(f"--cache-discount {self.cache_discount}: must be in [0, 1] (the share "
                       "of a prompt token's prefill a cache hit saves; 1: free)")
        if self.block_tokens < 1:
            out.append(f"--block-tokens {self.block_tokens}: must be >= 1 (vLLM's default: 16)")
        if self.cache_tokens < 0 or 0 < self.cache_tokens < self.block_tokens:
            out.append(f"--cache-tokens {self.cache_tokens}: must be 0 (unlimited) or at least "
                       f"one block (--block-tokens {self.block_tokens})")
        return out

    def prefill_s(self, uncached: int, cached: int) -> float:
        p = self.prefill_ms_per_token
        return (p * uncached + (1.0 - self.cache_discount) * p * cached) / 1000

    def step_s(self, batch: int) -> float:
        return (self.step_ms + self.step_ms_per_seq * batch) / 1000

    @property
    def num_blocks(self) -> int:
        """The cache's capacity in blocks (vllm:cache_config_info's num_gpu_blocks)."""
        return self.cache_tokens // self.block_tokens if self.cache_tokens else UNLIMITED_BLOCKS


class PrefixCache:
    """Chained block hashes, LRU over blocks (module docstring)."""

    def __init__(self, block_tokens: int, capacity_blocks: int | None) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, text: str, salt: str | None) -> list[bytes]:
        """The chained hashes of the full blocks of `text` (4 characters a token)."""
        width = 4 * self.block_tokens
        prev = hashlib.sha256(b"salt:" + salt.encode()).digest() if salt else b""
        out = []
        for i in range(len(text) // width):
            prev = hashlib.sha256(prev + text[i * width:(i + 1) * width].encode()).digest()
            out.append(prev)
        return out

    def hit_blocks(self, hashes: list[bytes]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self._blocks:
            n += 1
        return n

    def insert(self, hashes: list[bytes]) -> None:
        for h in reversed(hashes):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        if self.capacity_blocks is not None:
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)


@dataclass(eq=False)
class Job:
    """One request in the engine. `changed` is set at its first token, at most once per
    `FLUSH_S` of engine time after that, and when it is done; `notified_at` is the engine time
    of the last setting (when the tokens it announces were due)."""

    arrival: float
    hashes: list[bytes]
    prompt_tokens: int
    tokens: int  # N: completion tokens to produce
    generated: int = 0
    cached_tokens: int = 0
    notified_at: float = 0.0
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _notify(self, t: float) -> None:
        self.notified_at = t
        self.changed.set()


@dataclass
class EngineCounters:
    requests: int = 0  # admitted (prefilled)
    prefilled_tokens: int = 0  # uncached prompt tokens computed
    cached_tokens: int = 0  # prompt tokens served from the cache
    queried_tokens: int = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
    steps: int = 0  # decode steps


class Engine:
    """The continuous-batching engine (module docstring): one asyncio task, started on the
    first `submit`."""

    def __init__(self, model: StepModel) -> None:
        self.model = model
        self.cache = PrefixCache(model.block_tokens,
                                 model.num_blocks if model.cache_tokens else None)
        self.counters = EngineCounters()
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def job(self, arrival: float, prompt: str, prompt_tokens: int, tokens: int,
            salt: str | None) -> Job:
        return Job(arrival, self.cache.hashes(prompt, salt), prompt_tokens, max(1, tokens))

    def submit(self, job: Job) -> None:
        self.waiting.append(job)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def abort(self, job: Job) -> None:
        """Drop a job whose client went away (vLLM aborts it too)."""
        if job in self.waiting:
            self.waiting.remove(job)
        if job in self.running:
            self.running.remove(job)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        t = loop.time()
        c = self.model.max_running
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            if not self.running and self.waiting[0].arrival > t:
                t = self.waiting[0].arrival  # idle until now: start at the arrival
            admitted = []
            while self.waiting and self.waiting[0].arrival <= t and (
                    c <= 0 or len(self.running) < c):
                admitted.append(self.waiting.popleft())
                self.running.append(admitted[-1])
            for job in admitted:
                if job in self.running:  # not aborted while an earlier one prefilled
                    t = await self._prefill(loop, job, t)
            if self.running:
                t += self.model.step_s(len(self.running))
                await _until(loop, t)
                self.counters.steps += 1
                for job in list(self.running):
                    job.generated += 1
                    if job.generated >= job.tokens:
                        self._finish(job, t)
                    elif t - job.notified_at >= FLUSH_S - 1e-9:
                        job._notify(t)

    async def _prefill(self, loop: asyncio.AbstractEventLoop, job: Job, t: float) -> float:
        limit = (job.prompt_tokens - 1) // self.model.block_tokens
        cached = self.model.block_tokens * min(limit, self.cache.hit_blocks(job.hashes))
        job.cached_tokens = cached
        c = self.counters
        c.requests += 1
        c.queried_tokens += job.prompt_tokens
        c.cached_tokens += cached
        c.prefilled_tokens += job.prompt_tokens - cached
        t += self.model.prefill_s(job.prompt_tokens - cached, cached)
        await _until(loop, t)
        self.cache.insert(job.hashes)
        job.generated = 1
        if job.tokens <= 1:
            self._finish(job, t)
        else:
            job._notify(t)
        return t

    def _finish(self, job: Job, t: float) -> None:
        if job in self.running:  # else aborted during its prefill
            self.running.remove(job)
        job.done = True
        job._notify(t)


async def _until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    """Sleep until `due`; when already late, still yield once so the handlers of the tokens just
    made can write them."""
    await asyncio.sleep(max(0.0, due - loop.time()))
