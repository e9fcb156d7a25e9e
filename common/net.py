"""Ports and URLs. A URL with `/v1` is an `api_url` (what OpenAI clients take); the same server
without it is a `server_url` (where `/health`, `/metrics`, `/tokenize` and `/version` live). The
command line accepts either and normalizes with `api_url` / `server_url`."""

from __future__ import annotations

import socket

from compaction_bench.common.errors import SuiteError

API_SUFFIX = "/v1"
# The one default server port: `make serve`, the router in front of replicas, and every command
# that reaches the local server (PORT= / --port change it; replicas take PORT+2, PORT+3, ...).
DEFAULT_PORT = 8000


def server_url(url: str) -> str:
    """`http://host:port` for a server given with or without `/v1` (trailing slashes dropped)."""
    _check(url)
    return url.rstrip("/").removesuffix(API_SUFFIX).rstrip("/")


def api_url(url: str) -> str:
    """`http://host:port/v1` for a server given with or without `/v1`."""
    return server_url(url) + API_SUFFIX


def _check(url: str) -> None:
    if not url.startswith(("http://", "https://")) or "://" not in url or not url.split(
            "://", 1)[1].strip("/"):
        raise SuiteError(f"{url!r} is not a server URL; give one like http://127.0.0.1:8000 "
                         "(with or without /v1)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
