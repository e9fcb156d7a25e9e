"""What every engine's command is built from: the launcher's server settings, as a protocol
(serve.command.ServerConfig satisfies it), so the engines need not import the launcher."""

from __future__ import annotations

from typing import Protocol

from compaction_bench.serve.profile import Profile


class Launch(Protocol):
    """What an engine's command is built from (serve.command.ServerConfig)."""

    @property
    def profile(self) -> Profile: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def api_key(self) -> str | None: ...

    @property
    def fast_start(self) -> bool: ...
