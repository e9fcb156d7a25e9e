"""`python -m serve.cli`: start, stop and inspect vLLM servers for the suite's profiles."""

from __future__ import annotations

import os
import shlex
from typing import Annotated

import typer

from common.errors import run_cli
from serve.launcher import Server, ServerConfig, build_command, serve_foreground
from serve.model import resolve_model
from serve.process import stop_background
from serve.profile import known_profiles, load_profile, resolve_profile

app = typer.Typer(help="Start, stop and inspect the suite's vLLM servers.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

ProfileOpt = Annotated[
    str, typer.Option(help="profile name or .toml path; 'auto' picks one for this machine")
]


@app.command()
def run(
    profile: ProfileOpt = "auto",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    host: Annotated[str, typer.Option(help="bind address (HOST)")] = "127.0.0.1",
    model: Annotated[str | None, typer.Option(help="override the profile's model source")] = None,
    background: Annotated[bool, typer.Option(help="return once healthy; `stop` ends it")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for /health", min=1)] = 900.0,
) -> None:
    """Serve a profile: the target and compressor names from one engine."""
    config = ServerConfig(
        profile=resolve_profile(profile), host=host, port=port, model=model or None,
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
def stop(port: Annotated[int | None, typer.Option(help="only the server on this port")] = None,
         ) -> None:
    """Stop background servers started by this checkout (all, or the one on --port)."""
    stopped = stop_background(port)
    if not stopped:
        typer.echo("no server recorded in .run/" + (f" for port {port}" if port else ""))
    for record in stopped:
        if record.get("stale"):
            typer.echo(f"removed the stale record of port {record.get('port')}: pid "
                       f"{record.get('pid')} is gone or is now another process (not signalled)")
        else:
            typer.echo(f"stopped server on port {record['port']} (pid {record['pid']}, "
                       f"profile {record.get('profile')})")


@app.command()
def profiles() -> None:
    """List the shipped profiles."""
    for name in known_profiles():
        p = load_profile(name)
        typer.echo(f"{name:32} {p.engine:4}  {p.description}")


@app.command()
def show(profile: Annotated[str, typer.Argument(help="profile name or path")] = "auto",
         port: int = 8000) -> None:
    """Print the server command a profile runs (without starting or converting anything)."""
    p = resolve_profile(profile)
    typer.echo(f"# {p.name}: {p.description}")
    typer.echo(f"# regimes: shared {p.regimes.shared_users} users, overloaded "
               f"{p.overloaded_users} users, max_num_seqs {p.engine_args.max_num_seqs}")
    for key, value in p.env.items():
        typer.echo(f"{key}={shlex.quote(value)} \\")
    typer.echo(shlex.join(build_command(ServerConfig(profile=p, port=port), p.model.source)))


@app.command("prepare-model")
def prepare_model(profile: ProfileOpt = "auto") -> None:
    """Make the profile's model ready locally (converts an embedded model once)."""
    typer.echo(resolve_model(resolve_profile(profile).model.source))


if __name__ == "__main__":
    run_cli(app)
