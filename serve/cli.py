"""`python -m serve.cli`: start, stop and inspect vLLM servers for the suite's profiles."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from functools import wraps
from typing import Annotated, ParamSpec, TypeVar

import typer

from serve.errors import ServeError
from serve.hardware import detect_gpus
from serve.launcher import Server, ServerConfig, build_command, serve_foreground, stop_background
from serve.model import resolve_model
from serve.profile import Profile, default_profile, known_profiles, load_profile

app = typer.Typer(help="Start, stop and inspect the suite's vLLM servers.", no_args_is_help=True)

P = ParamSpec("P")
R = TypeVar("R")

ProfileOpt = Annotated[
    str, typer.Option(help="profile name or .toml path; 'auto' picks one for this machine")
]


def clear_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Print a `ServeError` as one line and exit 2, instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ServeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def pick_profile(name: str) -> Profile:
    if name == "auto":
        name = default_profile([g.name for g in detect_gpus()])
    return load_profile(name)


@app.command()
@clear_errors
def run(
    profile: ProfileOpt = "auto",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    host: Annotated[str, typer.Option(help="bind address (HOST)")] = "127.0.0.1",
    model: Annotated[str | None, typer.Option(help="override the profile's model source")] = None,
    background: Annotated[bool, typer.Option(help="return once healthy; `stop` ends it")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for /health")] = 900.0,
) -> None:
    """Serve a profile: the target and compressor names from one engine."""
    config = ServerConfig(
        profile=pick_profile(profile), host=host, port=port, model=model or None,
        api_key=os.environ.get("API_KEY") or None, ready_timeout_s=timeout,
    )
    if not background:
        raise typer.Exit(serve_foreground(config))
    server = Server(config)
    server.start()
    server.wait_ready()
    typer.echo(f"serving {', '.join(config.profile.model.served_names)} at {server.api_url} "
               f"(pid {server.process.pid if server.process else '?'}, log {server.log_path})")


@app.command()
@clear_errors
def stop(port: Annotated[int | None, typer.Option(help="only the server on this port")] = None,
         ) -> None:
    """Stop background servers started by this checkout (all, or the one on --port)."""
    stopped = stop_background(port)
    if not stopped:
        typer.echo("no server recorded in .run/ " + (f"for port {port}" if port else "") + "")
    for record in stopped:
        typer.echo(f"stopped server on port {record['port']} (pid {record['pid']}, "
                   f"profile {record['profile']})")


@app.command()
@clear_errors
def profiles() -> None:
    """List the shipped profiles."""
    for name in known_profiles():
        p = load_profile(name)
        typer.echo(f"{name:32} {p.engine:4}  {p.description}")


@app.command()
@clear_errors
def show(profile: Annotated[str, typer.Argument(help="profile name or path")] = "auto",
         port: int = 8000) -> None:
    """Print the server command a profile runs (without starting or converting anything)."""
    p = pick_profile(profile)
    typer.echo(f"# {p.name}: {p.description}")
    typer.echo(f"# regimes: shared {p.regimes.shared_users} users, overloaded "
               f"{p.overloaded_users} users, max_num_seqs {p.engine_args.max_num_seqs}")
    for key, value in p.env.items():
        typer.echo(f"{key}={shlex.quote(value)} \\")
    typer.echo(shlex.join(build_command(ServerConfig(profile=p, port=port), p.model.source)))


@app.command("prepare-model")
@clear_errors
def prepare_model(profile: ProfileOpt = "auto") -> None:
    """Make the profile's model ready locally (converts an embedded model once)."""
    typer.echo(resolve_model(pick_profile(profile).model.source))


if __name__ == "__main__":
    app()
