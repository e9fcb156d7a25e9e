"""One error root, one set of exit codes, one handler that every command line uses.

Every error the suite raises on bad input or a failed precondition is a `SuiteError`; its message
names the thing at fault (file, field, URL, value) and the fix, and its `exit_code` says what
kind of failure it is. `run_cli(app)` runs a Typer app so that a `SuiteError`, a bad argument or
Ctrl-C ends with exactly one line on stderr and the right exit code, never a traceback. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from enum import IntEnum
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # the command-line libraries load only where a command line runs
    import pydantic
    import typer


class ExitCode(IntEnum):
    """Exit codes of every `make` target and `python -m ...` command."""

    OK = 0
    FAILED = 1  # the command ran and its result is a failure (a run aborted, an arm not written)
    USAGE = 2  # bad input: an argument, a file, a profile, a name; the message says the fix
    UNAVAILABLE = 3  # something needed is not there or stopped: a server, an engine, a device
    INTERRUPTED = 130  # Ctrl-C or SIGTERM; records written so far are kept


class SuiteError(Exception):
    """Root of every error the suite raises for a cause outside its own code."""

    exit_code: ExitCode = ExitCode.USAGE


class UnavailableError(SuiteError):
    """A server, engine, device or helper process the command needs is missing or died."""

    exit_code = ExitCode.UNAVAILABLE


def describe_validation(exc: pydantic.ValidationError) -> str:
    """A pydantic error as one line: every field at fault with what was wrong."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(value)"
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(
            err["input"], dict) else ""
        parts.append(f"{where}: {err['msg']}{got}")
    return f"invalid {exc.title}: " + "; ".join(parts)


def fail(message: str, code: ExitCode) -> NoReturn:
    """Exit with `code`, the output ending in one line `error: <cause>`.

    A message's first line is its cause; any further lines are detail (a server log's tail),
    printed indented before the cause so that the last line the user sees names it.
    """
    lines = [line for line in str(message).strip().splitlines() if line.strip()]
    cause, detail = (lines[0], lines[1:]) if lines else ("(no message)", [])
    for line in detail:
        print(f"  | {line}", file=sys.stderr)
    print(f"error: {cause}", file=sys.stderr, flush=True)
    raise SystemExit(int(code))


def run_cli(app: typer.Typer, argv: list[str] | None = None) -> NoReturn:
    """Run a Typer app; known failures become one line and an `ExitCode` (see module doc).

    A `SuiteError` whose message spans lines (a server log tail) ends with its first line.
    Typer vendors its own copy of click, so its exceptions are matched through typer's own
    classes and click's alike.
    """
    import click
    import pydantic
    import typer

    usage_errors: tuple[type[BaseException], ...] = (click.ClickException, typer.TyperException)
    try:
        result = app(args=argv, standalone_mode=False)
    except SuiteError as exc:
        fail(str(exc), exc.exit_code)
    except (click.exceptions.Exit, typer.Exit) as exc:
        raise SystemExit(getattr(exc, "exit_code", 0)) from None
    except (click.exceptions.Abort, typer.Abort):
        fail("interrupted", ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        fail("interrupted; records written so far are kept", ExitCode.INTERRUPTED)
    except pydantic.ValidationError as exc:
        fail(describe_validation(exc), ExitCode.USAGE)
    except usage_errors as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if not message.strip():  # a command given no arguments has printed its help
            raise SystemExit(int(ExitCode.USAGE)) from None
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        fail(f"{message}{hint}", ExitCode.USAGE)
    raise SystemExit(int(result) if isinstance(result, int) else 0)
