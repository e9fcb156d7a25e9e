"""The locust user that replays background agents (imported only inside locust processes).

Schedule (open loop): user slot i starts at `t0 + i / spawn_rate`; after each request its next
one is due at `previous due + planned duration + tool gap` (`loadgen/replay.py`), a time fixed
by the plan, not by when the reply came back. A user is one agent, so it sends one request at a
time: when the server is slow a request is sent late, right after the one before it, and
`sent_s - intended_send_s` records the lag; the schedule never stretches and no request is ever
skipped. After its last turn a user starts over on the next history of its seeded order.

Every request fires locust's `events.request` with our own numbers (response_time = whole
request in ms, plus a separate "ttft" entry) and is appended to the requests JSONL as it ends.
A request cut short by the load stopping is written too, as an error.

Locust gives no user a global number, so slot = local spawn count * processes + worker index,
and `t0` comes from the process that starts the load (broadcast to workers as a message).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import ClassVar

import gevent
import numpy as np
from locust import User, task
from locust.env import Environment

from loadgen.config import BackgroundConfig
from loadgen.records import JsonlWriter
from loadgen.replay import Turn, load_plans
from loadgen.sse import StreamClient, prepare


class Counters:
    """This process's progress, written to a status file for `BackgroundLoad.wait_steady`."""

    def __init__(self) -> None:
        self.users = 0  # users spawned here
        self.started = 0  # users whose first request was sent
        self.in_flight = 0
        self.sent = 0
        self.done = 0
        self.errors = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class BackgroundAgent(User):
    """Replays background histories; configured through the class attributes set by `setup`."""

    abstract = False
    config: ClassVar[BackgroundConfig | None] = None
    plans: ClassVar[list[list[Turn]]] = []
    writer: ClassVar[JsonlWriter | None] = None
    counters: ClassVar[Counters] = Counters()
    t0: ClassVar[float | None] = None  # schedule start, on time.monotonic
    processes: ClassVar[int] = 1
    _spawned: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        runner = environment.runner
        worker = max(0, getattr(runner, "worker_index", 0) or 0)
        self.slot = next(self._spawned) * self.processes + worker
        self.counters.users += 1

    @classmethod
    def setup(cls, config: BackgroundConfig, processes: int) -> None:
        cls.config = config
        cls.plans = load_plans(config.histories, config.replay, model=config.model,
                               max_model_len=config.max_model_len)
        cls.writer = JsonlWriter(config.out)
        cls.processes = max(1, processes)

    @task
    def replay(self) -> None:
        config = self.config
        assert config is not None and self.writer is not None
        while self.t0 is None:  # workers: until the start message arrives
            gevent.sleep(0.01)
        rng = np.random.default_rng([config.seed, self.slot])
        order = [int(i) for i in rng.permutation(len(self.plans))]
        client = StreamClient(connect_timeout_s=config.connect_timeout_s,
                              read_timeout_s=config.read_timeout_s)
        due = self.t0 + self.slot / config.spawn_rate
        number = 0
        try:
            for cycle in itertools.count():
                for turn in self.plans[order[cycle % len(order)]]:
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
        request = prepare(config.api_url, turn.payload, request_id=request_id,
                          intended_send_s=due)
        block = _current_block(config.block_file)
        labels = {"history": turn.history, "turn": turn.turn, "cycle": cycle, "user": self.slot,
                  "max_tokens": turn.max_tokens, "max_tokens_source": turn.max_tokens_source}
        self.counters.started += number == 0
        self.counters.sent += 1
        self.counters.in_flight += 1
        try:
            result = client.send(request)
        except BaseException:  # GreenletExit when the load stops: keep the request on record
            partial = client.current
            if partial is not None:
                partial.end_s, partial.status = time.monotonic(), "error"
                partial.error = "stopped: the background load ended with this request in flight"
                self.writer.write(partial.record(regime=config.regime, source="background",
                                                 block=block, origin_s=config.origin,
                                                 **labels))
            self.counters.in_flight -= 1
            raise
        self.counters.in_flight -= 1
        self.counters.done += 1
        self.counters.errors += result.status != "ok"
        self.writer.write(result.record(regime=config.regime, source="background", block=block,
                                        origin_s=config.origin, **labels))
        end = result.end_s if result.end_s is not None else time.monotonic()
        exception = RuntimeError(result.error) if result.status != "ok" else None
        events = self.environment.events.request
        events.fire(request_type="POST", name="chat (background)",
                    response_time=(end - result.sent_s) * 1000,
                    response_length=result.completion_tokens or 0, exception=exception,
                    context={"request_id": request_id}, url=request.url)
        if result.first_token_s is not None:
            events.fire(request_type="TTFT", name="chat (background)",
                        response_time=(result.first_token_s - result.sent_s) * 1000,
                        response_length=0, exception=None, context={}, url=request.url)


def _sleep_until(due: float) -> None:
    delay = due - time.monotonic()
    if delay > 0:
        gevent.sleep(delay)


def _current_block(path: Path | None) -> int | None:
    """The block number the bench wrote to `path` (empty or missing file: outside blocks)."""
    if not path:
        return None
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None
