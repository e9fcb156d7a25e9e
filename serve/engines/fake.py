"""The suite's fake OpenAI server as an engine (loadgen/fakeserver.py): its timing and replies
come from the profile's `extra_args`; nothing to install, no model, no GPU."""

from __future__ import annotations

from pathlib import Path

from compaction_bench.serve.engines.base import Launch
from compaction_bench.serve.profile import Profile

FAKE_MODULE = "compaction_bench.loadgen.fakeserver"


class FakeEngine:
    name = "fake"

    def check(self, profile: Profile) -> str | None:
        return None

    def command(self, launch: Launch, model: Path | str, python: str) -> list[str]:
        return [python, "-m", FAKE_MODULE, "--host", launch.host, "--port", str(launch.port),
                *launch.profile.engine_args.extra_args]

    def env(self, profile: Profile, cpus: tuple[int, ...]) -> dict[str, str]:
        return {}
