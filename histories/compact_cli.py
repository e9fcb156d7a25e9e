"""`python -m histories.compact_cli`: write the compaction arms beside each task's clean.json.

`arms` compacts every task's clean history with the `self` compressor (the target's server,
name `compressor`) and the `external` one (any endpoint; by default the embedded Gemma 3 270M
on a second vLLM instance that this command starts and stops), checks each arm and writes
`self.json` / `external.json`. Servers already healthy on the given ports are used as they are;
none is started when no block is long enough to need a compressor.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from histories.arms import SEED_ARMS, write_arms
from histories.blocks import thought_label
from histories.checks import GATES, JudgeConfig
from histories.compaction import (
    IDENTITY_MAX_WORDS,
    CompressorConfig,
    external_compressor,
    self_compressor,
)
from histories.endpoint import EndpointConfig
from histories.format import HistoryError, load_history
from histories.lexical import count_words
from histories.prompts import REWRITE_PROMPTS
from histories.tasks import TaskError, runnable_tasks
from serve.cli import pick_profile
from serve.errors import ServeError
from serve.launcher import ServerConfig, server_for
from serve.profile import load_profile

app = typer.Typer(help="Compaction arms: external and self rewrites of clean histories.",
                  no_args_is_help=True)
HISTORY_ROOT = Path(__file__).parent
EXTERNAL_PROFILE = "cpu-gemma-compressor"


@app.callback()
def main() -> None:
    """Compaction arms: external and self rewrites of clean histories."""


@contextlib.contextmanager
def _maybe_server(wanted: bool, needed: bool, config: ServerConfig,
                  url: str | None) -> Iterator[str | None]:
    """The /v1 URL of a compressor's server: None when its arm is not wanted; the URL it would
    have, without starting it, when no block needs a compressor (every block of at most 12
    words stays identical, so on cpu-tiny no request is ever sent)."""
    if not wanted:
        yield None
    elif not needed:
        yield url or f"{config.base_url}/v1"
    else:
        with server_for(config, url) as got:
            yield got


def _needs_compressor(paths: list[Path]) -> bool:
    for path in paths:
        for _, block in load_history(path).reasoning_blocks():
            if count_words(thought_label(block)[1]) > IDENTITY_MAX_WORDS:
                return True
    return False


@app.command("arms")
def arms_cmd(
    task: Annotated[str, typer.Option(help="task id, or 'all' for every runnable task")] = "all",
    root: Annotated[Path, typer.Option(help="reads <root>/<task>/clean.json")] = HISTORY_ROOT,
    arms: Annotated[str, typer.Option(help="comma-separated: external, self")] = "external,self",
    profile: Annotated[str, typer.Option(help="the target's profile ('auto')")] = "auto",
    port: int = 8000,
    base_url: Annotated[str | None, typer.Option(help="the target's /v1 URL")] = None,
    external_profile: str = EXTERNAL_PROFILE,
    external_port: int = 8001,
    external_url: Annotated[str | None, typer.Option(
        help="an external compressor's /v1 URL (key from $COMPRESSOR_API_KEY)")] = None,
    external_model: str = "compressor",
    prompt: Annotated[str, typer.Option(help=f"one of {', '.join(REWRITE_PROMPTS)}")] = (
        "telegraphic"),
    cap_per_word: Annotated[float | None, typer.Option(
        help="first draft cap = this x raw words + 32 tokens (default: 2.0 for the embedded "
        "external compressor, the study's fixed cap otherwise)")] = None,
    judge_url: Annotated[str | None, typer.Option(help="fidelity judge /v1 URL")] = None,
    judge_model: str = "judge",
    gate: Annotated[str, typer.Option(help=f"one of {', '.join(GATES)}")] = "off",
) -> None:
    """Write external.json and self.json beside each task's clean.json (ledger and cache in
    <task>/compaction/)."""
    wanted = [a.strip() for a in arms.split(",") if a.strip()]
    if unknown := [a for a in wanted if a not in SEED_ARMS]:
        raise _fail(f"unknown arm(s) {unknown}; known: {', '.join(SEED_ARMS)}")
    if gate not in GATES:
        raise _fail(f"unknown gate {gate!r}; use one of {', '.join(GATES)}")
    try:
        ids = runnable_tasks() if task == "all" else [task]
        paths = [root / t / "clean.json" for t in ids]
        if missing := [str(p) for p in paths if not p.is_file()]:
            raise _fail(f"no clean history at {', '.join(missing)}; acquire first "
                        "(`make histories` or `python -m histories.cli acquire`)")
        target = ServerConfig(profile=pick_profile(profile), port=port)
        external = ServerConfig(profile=load_profile(external_profile), port=external_port)
        judge = (JudgeConfig(endpoint=EndpointConfig(base_url=judge_url, model=judge_model))
                 if judge_url else None)
        needed = _needs_compressor(paths)
        with _maybe_server("self" in wanted, needed, target, base_url) as target_url, \
                _maybe_server("external" in wanted, needed, external, external_url) as ext_url:
            compressors: dict[str, CompressorConfig] = {}
            if ext_url is not None:
                per_word = cap_per_word if cap_per_word or external_url else 2.0
                compressors["external"] = external_compressor(
                    ext_url, model=external_model, prompt=prompt,
                    max_tokens_per_raw_word=per_word)
            if target_url is not None:
                compressors["self"] = self_compressor(
                    target_url, model=target.profile.model.compressor_name, prompt=prompt,
                    max_tokens_per_raw_word=cap_per_word)
            failed = False
            for path in paths:
                for result in write_arms(path, compressors, judge=judge, gate=gate):
                    failed |= not result.written
                    status = "written" if result.written else "NOT written"
                    typer.echo(f"{result.path}: {status}; " + json.dumps(
                        {k: result.totals.get(k) for k in (
                            "blocks", "rewritten", "identity-short", "reverted-not-shorter",
                            "failed", "words_in", "words_out", "latency_s")}))
                    for problem in result.problems:
                        typer.echo(f"  problem: {problem}", err=True)
    except (ServeError, TaskError, HistoryError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if failed:
        raise typer.Exit(1)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


if __name__ == "__main__":
    app()
