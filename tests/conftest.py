"""Shared fixtures. The integration tests run against one real vLLM CPU server with the embedded
model, started once per test session (cold start is 1.5-2 minutes on 2 cores)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve.launcher import Server, ServerConfig, start_server
from serve.profile import load_profile


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
    """The real vLLM CPU server on the `cpu-tiny` profile, healthy, on a free port."""
    config = ServerConfig(profile=load_profile("cpu-tiny"), port=free_port(),
                          log_path=_private_run_dir / "session-server.log")
    server = start_server(config)
    yield server
    server.stop()
