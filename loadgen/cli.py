"""`compaction-bench load`: background load across hosts (docs/load.md).

    load run CONFIG.json           a background load by itself (master; local workers merged)
    load worker master=H:P out=DIR     one locust worker, on any host that reaches the master
    load merge RUN_DIR DIR...          copied worker folders into RUN_DIR/requests.jsonl, checked

Settings are given as every command's are (common/options.py): `name=value` words, `--config`,
COMPBENCH_<NAME>, the flags users know (`--master`, `--out`) as aliases.

locust monkey-patches the process that imports it, so `worker` replaces this process with the
locust entry point (`os.execv`) and `run` starts locust in processes of its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.options import (
    ConfigFile,
    FromEnv,
    ShowSettings,
    alias,
    settings_from,
    show_settings,
    split_words,
    words_help,
)

app = typer.Typer(help="Background load across hosts: locust master and workers, each worker's "
                  "raw records merged into the run's requests.jsonl.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


class WorkerConfig(BaseModel):
    """`load worker`: one locust worker of a master elsewhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str | None = Field(default=None, description="the master's HOST:PORT (its "
                               "master.json; the bench prints it)")
    out: Path | None = Field(default=None, description="folder for this worker's raw records "
                             "and sidecar")


class RunConfig(BaseModel):
    """`load run CONFIG.json`: a background load by itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steady_timeout_s: float = Field(default=600.0, gt=0, description="seconds to wait for "
                                    "every user's first request")


class MergeConfig(BaseModel):
    """`load merge RUN_DIR DIR...`: copied worker folders checked and merged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int | None = Field(default=None, ge=1, description="how many workers' records "
                                "to expect in all")
    allow_unfinished: bool = Field(default=False, description="merge workers that did not "
                                   "stop cleanly (their count cannot be checked)")


@app.command()
def worker(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("master=10.0.0.1:5557 out=/tmp/bg-B"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    master: Annotated[str | None, alias("master")] = None,
    out: Annotated[Path | None, alias("out")] = None,
) -> None:
    """One locust worker: gets config and histories from the master, writes its own raw
    records with a clock anchor; stops when the master stops (or on Ctrl-C / SIGTERM)."""
    if show:
        show_settings(WorkerConfig)
        return
    c = settings_from(WorkerConfig, "load worker", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    if c.master is None or c.out is None:
        raise typer.BadParameter("give the master and a folder: compaction-bench load worker "
                                 "master=HOST:PORT out=DIR (the bench prints both)",
                                 param_hint="master=, out=")
    argv = [sys.executable, "-m", "compaction_bench.loadgen.locust_main", "--worker",
            "--master", c.master, "--out", str(c.out)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@app.command()
def run(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Argument(
        help="a BackgroundConfig JSON file (loadgen/background.py)", show_default=False)] = None,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("steady_timeout_s=300"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    steady_timeout_s: Annotated[float | None, alias("steady_timeout_s")] = None,
) -> None:
    """A background load by itself until its duration_s or Ctrl-C: the master waits for its
    local and remote workers; local workers' records are merged into `out` when it stops."""
    from compaction_bench.loadgen.background import BackgroundConfig, BackgroundLoad

    if show:
        show_settings(RunConfig)
        return
    if config is None:
        raise typer.BadParameter("give the load's config: compaction-bench load run "
                                 "<config.json>", param_hint="CONFIG")
    c = settings_from(RunConfig, "load run", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    loaded = BackgroundConfig.load(config)
    with BackgroundLoad(loaded) as load:
        status = load.wait_steady(timeout_s=c.steady_timeout_s)
        typer.echo(f"steady: {status.users} users on {status.processes} status file(s)")
        assert load.process is not None
        while load.process.poll() is None:  # Ctrl-C: the with block stops it and merges
            time.sleep(0.5)
    typer.echo(f"records in {loaded.out}")


@app.command()
def merge(
    ctx: typer.Context,
    run_dir: Annotated[Path | None, typer.Argument(
        help="the run folder (its requests.jsonl)", show_default=False)] = None,
    args: Annotated[list[str] | None, typer.Argument(
        help="worker folders (each worker's out=), copied from their hosts, then any settings "
        "as name=value (workers=2)", show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    workers: Annotated[int | None, alias("workers")] = None,
    allow_unfinished: Annotated[bool | None, alias(
        "allow_unfinished", "--allow-unfinished/--no-allow-unfinished")] = None,
) -> None:
    """Check and merge: no record lost or duplicated, each agent on one worker, each on the
    run's timeline (the anchor's precision is printed per worker)."""
    from compaction_bench.loadgen.merge import merge_workers

    if show:
        show_settings(MergeConfig)
        return
    paths, words = split_words(args)
    if run_dir is None or not paths:
        raise typer.BadParameter("give the run folder and the workers' folders: "
                                 "compaction-bench load merge results/<id> /tmp/bg-B ...",
                                 param_hint="RUN_DIR FOLDERS")
    c = settings_from(MergeConfig, "load merge", words=words, file=config_file,
                      from_env=from_env, flags=ctx.params)
    merged = merge_workers([Path(p) for p in paths], run_dir / "requests.jsonl",
                           expected_workers=c.workers, allow_unfinished=c.allow_unfinished)
    for one in merged:
        typer.echo(f"{one.name} ({one.host}): {one.records} records, {len(one.users)} users, "
                   f"clock anchor +-{one.precision_s * 1000:.3f} ms")
    typer.echo(f"merged {sum(m.records for m in merged)} records into "
               f"{run_dir / 'requests.jsonl'}")
