"""Shared fixtures. The integration tests run against one real vLLM CPU server with the embedded
model, started once per test session (cold start is 1.5-2 minutes on 2 cores)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from compaction_bench.common.net import free_port
from compaction_bench.serve.launcher import Server, ServerConfig, is_healthy
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



# The session server starts as soon as collection knows an integration test will run, and the
# integration tests run last: its cold start (1.5-2 minutes of one core) overlaps the unit tests
# instead of adding to them.
_SESSION: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Pid files and logs of test servers go to a temp folder, not the checkout's `.run/`."""
    path = Path(tempfile.mkdtemp(prefix="compbench-test-run-"))
    _SESSION["old_run_dir"] = os.environ.get("COMPBENCH_RUN_DIR")
    _SESSION["run_dir"] = path
    os.environ["COMPBENCH_RUN_DIR"] = str(path)


def _start_session_server() -> Server:
    # fast_start: no torch.compile (a third of the cold start); no test measures step times
    server = Server(ServerConfig(profile=load_profile("cpu-tiny"), port=free_port(),
                                 log_path=_SESSION["run_dir"] / "session-server.log",
                                 fast_start=True))
    server.start()
    _SESSION["server"] = server
    return server


def _needs_server(item: pytest.Item) -> bool:
    return "cpu_server" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: only the tests that will run count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    items.sort(key=_needs_server)  # stable: file order within each group
    if (any(map(_needs_server, items)) and not os.environ.get("COMPBENCH_TEST_SERVER_PORT")
            and not config.option.collectonly):
        _start_session_server()  # spawned now; `cpu_server` waits for /health


def pytest_unconfigure(config: pytest.Config) -> None:
    server = _SESSION.pop("server", None)
    if server is not None:
        server.stop()
    old = _SESSION.get("old_run_dir")
    if old is None:
        os.environ.pop("COMPBENCH_RUN_DIR", None)
    else:
        os.environ["COMPBENCH_RUN_DIR"] = old


@pytest.fixture(scope="session")
def cpu_server() -> Iterator[Server]:
    """The real vLLM CPU server on the `cpu-tiny` profile, healthy, on a free port.

    For quick local iterations, COMPBENCH_TEST_SERVER_PORT=<port> reuses a cpu-tiny server
    already running on that port (`make serve`); CI never sets it."""
    reuse = os.environ.get("COMPBENCH_TEST_SERVER_PORT")
    if reuse:
        existing = Server(ServerConfig(profile=load_profile("cpu-tiny"), port=int(reuse)))
        if not is_healthy(existing.server_url):
            pytest.exit(f"COMPBENCH_TEST_SERVER_PORT={reuse}: no healthy server there", 2)
        yield existing  # not ours: never stopped here
        return
    server = _SESSION.get("server")
    if server is None:  # requested by a test the collection did not see coming
        server = _start_session_server()
    server.wait_ready()
    yield server
