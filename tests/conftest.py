"""Shared fixtures. The integration tests run against one real vLLM CPU server with the embedded
model, started once per test session (cold start is 1.5-2 minutes on 2 cores)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from serve.launcher import Server, ServerConfig, is_healthy, start_server
from serve.profile import load_profile

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session", autouse=True)
def _private_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Pid files and logs of test servers go to a temp folder, not the checkout's `.run/`."""
    path = tmp_path_factory.mktemp("run")
    old = os.environ.get("COMPBENCH_RUN_DIR")
    os.environ["COMPBENCH_RUN_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("COMPBENCH_RUN_DIR", None)
    else:
        os.environ["COMPBENCH_RUN_DIR"] = old


@pytest.fixture(scope="session")
def cpu_server(_private_run_dir: Path) -> Iterator[Server]:
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
    config = ServerConfig(profile=load_profile("cpu-tiny"), port=free_port(),
                          log_path=_private_run_dir / "session-server.log")
    server = start_server(config)
    yield server
    server.stop()
