"""The engines a profile can name (serve/engines/__init__.py), by their `server` name."""

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
