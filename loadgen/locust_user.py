"""The locust user that replays background agents (imported only inside locust processes).

Schedule (open loop): user slot i starts at `t0 + i / spawn_rate`; after each request its next
one is due at `previous due + planned duration + tool gap` (`loadgen/schedule.py`), a time fixed
by the schedule, not by when the reply came back. A user is one agent, so it sends one request at a
time: when the server is slow a request is sent late, right after the one before it, and
`sent_s - intended_send_s` records the lag; the schedule never stretches and no request is ever
skipped. After its last turn a user starts over on the next history of its seeded order.

Every request fires locust's `events.request` with our own numbers (response_time = whole
request in ms, plus a separate "ttft" entry; locust's aggregated percentiles are never used)
and is appended to the requests JSONL as it ends: the run's file, shifted to the run's start,
in one local process; the worker's own raw file, on its own clock, on a worker
(`loadgen/merge.py` places it on the run's timeline). A request cut short by the load stopping
is written too, as an error.

Locust gives no user a global number, so slot = local spawn count * processes + worker index
(unique while locust's rebalancing stays off, its default: a user object lives and dies in one
worker process, so an agent is never split), and `t0` comes from the process that starts the
load (sent to workers with the setup message). Each user sends its own cache_salt
(`BackgroundConfig.user_salt`), recorded per request.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import ClassVar

import gevent
import numpy as np
from locust import User, task
from locust.env import Environment

from compaction_bench.common.files import JsonlWriter
from compaction_bench.loadgen.background import BackgroundConfig
from compaction_bench.loadgen.schedule import Turn, load_schedules
from compaction_bench.serve.engines import vllm_wire as dialect
from compaction_bench.transport.client import StreamClient, prepare
from compaction_bench.transport.request import RequestRecord


class Counters:
    """This process's progress, written to a status file for `BackgroundLoad` to check."""

    def __init__(self) -> None:
        self.users = 0  # users spawned here
        self.started = 0  # users whose first request was sent
        self.failed_first = 0  # users whose first request failed
        self.answered = 0  # users that got at least one successful reply
        self.in_flight = 0
        self.sent = 0
        self.done = 0
        self.ok = 0
        self.errors = 0
        self.unauthorized = 0  # HTTP 401/403: the load is not allowed on the server
        self.last_ok_t = 0.0  # time.monotonic() of the latest successful reply (0: none)

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


class BackgroundAgent(User):
    """Replays background histories; configured through the class attributes set by `setup`."""

    abstract = False
    config: ClassVar[BackgroundConfig | None] = None
    schedules: ClassVar[list[list[Turn]]] = []
    writer: ClassVar[JsonlWriter | None] = None
    counters: ClassVar[Counters] = Counters()
    t0: ClassVar[float | None] = None  # schedule start, on this process's time.monotonic
    processes: ClassVar[int] = 1
    api_key: ClassVar[str | None] = None
    shift_s: ClassVar[float] = 0.0  # subtracted from record times (0: raw, on a worker)
    written: ClassVar[int] = 0  # records written by this process
    block: ClassVar[int | None] = None  # relayed by the master: where the block file is not
    _spawned: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        runner = environment.runner
        worker = max(0, getattr(runner, "worker_index", 0) or 0)
        self.slot = next(self._spawned) * self.processes + worker
        self.counters.users += 1
        self.answered = False

    @classmethod
    def setup(cls, config: BackgroundConfig, *, raw: bool = False) -> None:
        """Load the schedules and open `config.out`: shifted to `config.origin`, or `raw`
        (a worker: its own clock, placed on the run's timeline by the merge)."""
        cls.config = config
        cls.schedules = load_schedules(config.histories, config.replay, model=config.model,
                                       max_model_len=config.max_model_len)
        cls.writer = JsonlWriter(config.out)
        cls.processes = config.processes
        cls.shift_s = 0.0 if raw else config.origin
        # The key comes from the environment, never from the config file in the run folder.
        cls.api_key = os.environ.get(config.api_key_env) if config.api_key_env else None

    @task
    def replay(self) -> None:
        config = self.config
        assert config is not None and self.writer is not None
        while self.t0 is None:  # workers: until the start message arrives
            gevent.sleep(0.01)
        rng = np.random.default_rng([config.seed, self.slot])
        order = [int(i) for i in rng.permutation(len(self.schedules))]
        client = StreamClient(connect_timeout_s=config.connect_timeout_s,
                              read_timeout_s=config.read_timeout_s)
        due = self.t0 + self.slot / config.spawn_rate
        number = 0
        try:
            for cycle in itertools.count():
                for turn in self.schedules[order[cycle % len(order)]]:
                    _sleep_until(due)
                    self._send(client, turn, due, number, cycle)
                    number += 1
                    due += turn.planned_s + turn.gap_s
        finally:
            client.close()

    def _send(self, client: StreamClient, turn: Turn, due: float, number: int,
              cycle: int) -> None:
        config = self.config
        assert config is not None and self.writer is not None
        request_id = f"bg-{self.slot}-{number}"
        salt = config.user_salt(self.slot)
        # one conversation of one background agent: a router keeps it on one replica
        request = prepare(config.api_url, {**turn.payload, **dialect.cache_salt(salt)},
                          request_id=request_id,
                          intended_send_s=due, api_key=self.api_key,
                          session_id=f"bg-{self.slot}-c{cycle}")
        identity = {"regime": config.regime, "source": "background",
                    "block": _current_block(config.block_file, self.block),
                    "history": turn.history,
                    "turn": turn.turn, "cycle": cycle, "user": self.slot, "cache_salt": salt,
                    "max_tokens": turn.max_tokens, "max_tokens_source": turn.max_tokens_source}
        counters = self.counters
        counters.started += number == 0
        counters.sent += 1
        counters.in_flight += 1
        try:
            response = client.send(request)
        except BaseException:  # GreenletExit when the load stops: keep the request on record
            partial = client.partial("stopped: the background load ended with this request "
                                     "in flight")
            if partial is not None:
                self._write(partial.record.labelled(**identity))
            counters.in_flight -= 1
            raise
        record = response.record
        counters.in_flight -= 1
        counters.done += 1
        if record.ok:
            counters.ok += 1
            counters.last_ok_t = time.monotonic()
            if not self.answered:
                self.answered = True
                counters.answered += 1
        else:
            counters.errors += 1
            counters.unauthorized += record.http_status in (401, 403)
            counters.failed_first += number == 0
        self._write(record.labelled(**identity))
        end = record.end_s if record.end_s is not None else time.monotonic()
        exception = RuntimeError(record.error) if not record.ok else None
        events = self.environment.events.request
        events.fire(request_type="POST", name="chat (background)",
                    response_time=(end - record.sent_s) * 1000,
                    response_length=record.completion_tokens or 0, exception=exception,
                    context={"request_id": request_id}, url=request.url)
        if record.first_token_s is not None:
            events.fire(request_type="TTFT", name="chat (background)",
                        response_time=(record.first_token_s - record.sent_s) * 1000,
                        response_length=0, exception=None, context={}, url=request.url)


    def _write(self, record: RequestRecord) -> None:
        assert self.writer is not None
        self.writer.write(record.shifted(self.shift_s).to_json())
        BackgroundAgent.written += 1


def _sleep_until(due: float) -> None:
    delay = due - time.monotonic()
    if delay > 0:
        gevent.sleep(delay)


def _current_block(path: Path | None, missing: int | None = None) -> int | None:
    """The block number the bench wrote to `path` (empty file: outside blocks); `missing` where
    there is no such file here (a worker on another host: the number the master relayed)."""
    if not path:
        return missing
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return missing
    return int(text) if text.lstrip("-").isdigit() else None
