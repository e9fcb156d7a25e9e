"""`python -m histories.cli`: acquire, audit, import, export and continue agent histories."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from histories.acquire import AcquisitionError, acquire
from histories.audit import audit as render_audit
from histories.chat import config_for_profile as model_config
from histories.continuation import continue_history
from histories.export import export_minisweagent
from histories.format import HistoryError, load_history, save_history, write_json_atomic
from histories.importers import import_history
from histories.tasks import TaskError, load_task, runnable_tasks
from serve.cli import pick_profile
from serve.errors import ServeError
from serve.launcher import ServerConfig, server_for

app = typer.Typer(help="Agent histories: acquire to a fork, audit, import, export, continue.",
                  no_args_is_help=True)
HISTORY_ROOT = Path(__file__).parent

ProfileOpt = Annotated[str, typer.Option(help="server profile ('auto': for this machine)")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="use this OpenAI-compatible /v1 URL")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command("acquire")
def acquire_cmd(
    task: Annotated[str, typer.Option(help="task id, or 'all' for every runnable task")] = "all",
    profile: ProfileOpt = "auto", port: int = 8000, base_url: BaseUrlOpt = None, seed: int = 0,
    fork_turn: Annotated[int | None, typer.Option(help="override the task's fork turn")] = None,
    out: Annotated[Path, typer.Option(help="writes <out>/<task>/clean.json")] = HISTORY_ROOT,
) -> None:
    """Run the agent to each task's fork and save the clean history."""
    try:
        chosen = pick_profile(profile)
        tasks = [load_task(t) for t in (runnable_tasks() if task == "all" else [task])]
        with server_for(ServerConfig(profile=chosen, port=port), base_url) as url:
            for t in tasks:
                got = acquire(t, model_config(chosen, url, seed),
                              fork_turn=fork_turn, provenance={"profile": chosen.name})
                path = out / t.id / "clean.json"
                save_history(got.history, path)
                typer.echo(f"{path}: fork at message {got.history.fork.message_index} "  # type: ignore[union-attr]
                           f"after {len(got.requests)} requests")
    except (ServeError, TaskError, AcquisitionError, HistoryError) as exc:
        raise _fail(str(exc)) from None


@app.command("audit")
def audit_cmd(path: Path, profile: ProfileOpt = "auto", port: int = 8000,
              base_url: BaseUrlOpt = None, model: str = "target",
              json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Render two consecutive requests of a history through the server's /tokenize."""
    try:
        history = load_history(path)
        with server_for(ServerConfig(profile=pick_profile(profile), port=port), base_url) as url:
            result = render_audit(history, url, model=model,
                                  api_key=os.environ.get("API_KEY") or "unused")
    except (ServeError, HistoryError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(json.dumps(result.to_json(), indent=2) if json_out else result.summary())


@app.command("import")
def import_cmd(source: Path, out: Path, task: str | None = None,
               fork: Annotated[int | None, typer.Option(help="assistant message index")] = None,
               ) -> None:
    """Import a trajectory (mini-swe-agent, SWE-agent, OpenAI messages, study record)."""
    try:
        save_history(import_history(source, task=task, fork=fork), out)
    except HistoryError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"wrote {out}")


@app.command("export")
def export_cmd(path: Path, out: Path) -> None:
    """Export a history as a mini-swe-agent trajectory (opens in mini-swe-agent's inspector)."""
    try:
        write_json_atomic(export_minisweagent(load_history(path)), out)
    except HistoryError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"wrote {out}")


@app.command("continue")
def continue_cmd(path: Path, profile: ProfileOpt = "auto", port: int = 8000,
                 base_url: BaseUrlOpt = None, seed: int = 0,
                 step_limit: int | None = None) -> None:
    """Continue a saved history from its fork to a terminal status; print the timing."""
    try:
        history = load_history(path)
        chosen = pick_profile(profile)
        with server_for(ServerConfig(profile=chosen, port=port), base_url) as url:
            result = continue_history(history, load_task(history.task),
                                      model_config(chosen, url, seed), step_limit=step_limit)
    except (ServeError, TaskError, HistoryError, ValueError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(json.dumps({
        "task": result.task, "arm": result.arm, "terminal_status": result.terminal_status,
        "turns": result.turns, "setup_s": result.setup_s, "postfork_s": result.postfork_s,
        "validation_passed": result.validation.passed if result.validation else None,
        "requests": len(result.requests), "error": result.error}, indent=2))


if __name__ == "__main__":
    app()
