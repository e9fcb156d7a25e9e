"""The fake server (`loadgen.fakeserver`) in a subprocess of its own, driven over HTTP: start
and stop it, queue scripted replies, read back the request bodies it received, and its own
lateness. A subprocess, so its timing does not share the measured client's GIL."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from typing import Any

from compaction_bench.common.errors import UnavailableError
from compaction_bench.common.processtree import stop_tree
from compaction_bench.loadgen.fakeserver import FakeConfig

__all__ = ["FakeConfig", "FakeProcess"]


class FakeProcess:
    """The fake server in a subprocess of its own (so its timing does not share our GIL).

    `with FakeProcess(FakeConfig(ttft_ms=200)) as fake: fake.api_url` -> `http://.../v1`;
    `fake.script([...])` queues replies, `fake.requests()` returns the bodies received.
    """

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[str] | None = None
        self.port = config.port

    @property
    def server_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.server_url + "/v1"

    def start(self) -> FakeProcess:
        c = self.config
        self.process = subprocess.Popen(
            [sys.executable, "-m", "compaction_bench.loadgen.fakeserver", "--host", c.host,
             "--port", str(c.port),
             "--ttft-ms", str(c.ttft_ms), "--itl-ms", str(c.itl_ms), "--tokens", str(c.tokens),
             "--cached-tokens", str(c.cached_tokens), "--max-running", str(c.max_running),
             "--engine", c.engine, "--prefill-ms-per-token", str(c.prefill_ms_per_token),
             "--cache-discount", str(c.cache_discount), "--step-ms", str(c.step_ms),
             "--step-ms-per-seq", str(c.step_ms_per_seq), "--block-tokens",
             str(c.block_tokens), "--cache-tokens", str(c.cache_tokens),
             *(["--default-content", c.default_content] if c.default_content is not None
               else []),
             *(["--answer-as", c.answer_as] if c.answer_as is not None else [])],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise UnavailableError(f"fake server did not start (said {line!r})")
        self.port = int(line.split()[-1])
        return self

    def _call(self, path: str, data: Any = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        request = urllib.request.Request(self.server_url + path, data=body,
                                         method="POST" if body is not None else "GET")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stats(self, *, reset: bool = False) -> dict[str, Any]:
        """The server's own lateness so far (optionally clearing it after reading)."""
        value: dict[str, Any] = self._call("/fake/stats")
        if reset:
            self.reset()
        return value

    def script(self, replies: list[dict[str, Any]]) -> None:
        """Queue scripted replies, one per coming chat request (see the module docstring)."""
        self._call("/fake/script", replies)

    def requests(self) -> list[dict[str, Any]]:
        """Every chat request body received since the last reset."""
        bodies: list[dict[str, Any]] = self._call("/fake/requests")
        return bodies

    def reset(self) -> None:
        self._call("/fake/reset", {})

    def stop(self) -> None:
        if self.process is not None:
            stop_tree(self.process, grace_s=5.0)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> FakeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
