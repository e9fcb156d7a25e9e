"""`compaction-bench load`: background load across hosts (docs/load.md).

    load run CONFIG.json           a background load by itself (master; local workers merged)
    load worker --master H:P --out DIR    one locust worker, on any host that reaches the master
    load merge RUN_DIR DIR...      copied worker folders into RUN_DIR/requests.jsonl, checked

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

app = typer.Typer(help="Background load across hosts: locust master and workers, each worker's "
                  "raw records merged into the run's requests.jsonl.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def worker(
    master: Annotated[str, typer.Option(help="the master's HOST:PORT (its master.json)")],
    out: Annotated[Path, typer.Option(help="folder for this worker's raw records and sidecar")],
) -> None:
    """One locust worker: gets config and histories from the master, writes its own raw
    records with a clock anchor; stops when the master stops (or on Ctrl-C / SIGTERM)."""
    argv = [sys.executable, "-m", "compaction_bench.loadgen.locust_main", "--worker",
            "--master", master, "--out", str(out)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="a BackgroundConfig JSON file "
                                           "(loadgen/background.py)")],
    steady_timeout_s: Annotated[float, typer.Option(help="seconds to wait for every user's "
                                                    "first request")] = 600.0,
) -> None:
    """A background load by itself until its duration_s or Ctrl-C: the master waits for its
    local and remote workers; local workers' records are merged into `out` when it stops."""
    from compaction_bench.loadgen.background import BackgroundConfig, BackgroundLoad

    settings = BackgroundConfig.load(config)
    with BackgroundLoad(settings) as load:
        status = load.wait_steady(timeout_s=steady_timeout_s)
        typer.echo(f"steady: {status.users} users on {status.processes} status file(s)")
        assert load.process is not None
        while load.process.poll() is None:  # Ctrl-C: the with block stops it and merges
            time.sleep(0.5)
    typer.echo(f"records in {settings.out}")


@app.command()
def merge(
    run_dir: Annotated[Path, typer.Argument(help="the run folder (its requests.jsonl)")],
    folders: Annotated[list[Path], typer.Argument(help="worker folders (each worker's --out), "
                                                  "copied from their hosts")],
    workers: Annotated[int | None, typer.Option(help="how many workers' records to expect "
                                                "in all")] = None,
    allow_unfinished: Annotated[bool, typer.Option(
        help="merge workers that did not stop cleanly (their count cannot be checked)")] = False,
) -> None:
    """Check and merge: no record lost or duplicated, each agent on one worker, each on the
    run's timeline (the anchor's precision is printed per worker)."""
    from compaction_bench.loadgen.merge import merge_workers

    merged = merge_workers(folders, run_dir / "requests.jsonl", expected_workers=workers,
                           allow_unfinished=allow_unfinished)
    for one in merged:
        typer.echo(f"{one.name} ({one.host}): {one.records} records, {len(one.users)} users, "
                   f"clock anchor +-{one.precision_s * 1000:.3f} ms")
    typer.echo(f"merged {sum(m.records for m in merged)} records into "
               f"{run_dir / 'requests.jsonl'}")
