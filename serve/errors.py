"""The exceptions `serve` raises. Each message names the thing at fault and, where it can, the fix.

All are `common.errors.SuiteError`s: every command line prints them as one line with their exit
code (`common.errors.run_cli`).
"""

from compaction_bench.common.errors import ExitCode, SuiteError


class ServeError(SuiteError):
    """Base class of every error the serve package raises on bad input or a failed server."""


class ProfileError(ServeError):
    """A profile is unknown, unreadable or invalid."""


class EngineUnavailableError(ServeError):
    """The profile needs an engine or a device this machine does not have."""

    exit_code = ExitCode.UNAVAILABLE


class ModelNotFoundError(ServeError):
    """The model a profile names is not on this machine (nothing is downloaded at run time)."""


class PortInUseError(ServeError):
    """The address the server should bind is already taken."""


class ServerStartError(ServeError):
    """The server process died or did not become healthy while starting."""

    exit_code = ExitCode.UNAVAILABLE


class ServerUnreachableError(ServeError):
    """A server the command was pointed at does not answer."""

    exit_code = ExitCode.UNAVAILABLE
