"""`compaction-bench kernels`: measure the device and fit the cost model (`run`, what `make
kernels` calls), read a results file back as the plan does (`check`), list the physical limits
table (`limits`), and the GPU device check (`device-check`, what `make kernels-gpu` runs)."""

from __future__ import annotations

import sys
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
    words_help,
)

app = typer.Typer(help="Measured device costs: micro-benchmarks, server probes, cost-model fits.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def run(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("quick=1 seed=3 base_url=http://host:8000"), show_default=False)
    ] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    out_dir: Annotated[Path | None, alias("out_dir")] = None,
    micro: Annotated[bool | None, alias("micro", "--micro/--no-micro")] = None,
    probe: Annotated[bool | None, alias("probe", "--probe/--no-probe")] = None,
    quick: Annotated[bool | None, alias("quick", "--quick/--no-quick")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
    threads: Annotated[int | None, alias("threads")] = None,
) -> None:
    """Micro-benchmarks, server probes and fits; writes data/kernels/<...>.json."""
    from compaction_bench.kernels.calibration import CalibrationConfig, calibrate

    if show:
        show_settings(CalibrationConfig)
        return
    config = settings_from(CalibrationConfig, "kernels", words=settings, file=config_file,
                           from_env=from_env, flags=ctx.params)
    calibrate(config, argv=["compaction-bench", *sys.argv[1:]], say=typer.echo)


class ResultsCheckConfig(BaseModel):
    """`kernels check RESULTS`: a results file checked as the capacity plan loads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str | None = Field(default=None, description="also predict the measured levels "
                               "on this GPU (a limits.toml row, e.g. H100) through the "
                               "roofline fit")


@app.command()
def check(
    ctx: typer.Context,
    results: Annotated[Path | None, typer.Argument(
        help="a results file (data/kernels/*.json)", show_default=False)] = None,
    settings: Annotated[list[str] | None, typer.Argument(help=words_help("device=H100"),
                                                         show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    device: Annotated[str | None, alias("device")] = None,
) -> None:
    """Load a results file as the capacity plan does; print prediction error per level."""
    from compaction_bench.kernels.costmodel import load
    from compaction_bench.kernels.fitreport import check_lines
    from compaction_bench.kernels.limits import LimitsError, limits_for

    if show:
        show_settings(ResultsCheckConfig)
        return
    if results is None:
        raise typer.BadParameter("give the results file: compaction-bench kernels check "
                                 "data/kernels/<file>.json", param_hint="RESULTS")
    device = settings_from(ResultsCheckConfig, "kernels check", words=settings,
                           file=config_file, from_env=from_env, flags=ctx.params).device
    model = load(results)
    transfer = None
    if device:
        limits = limits_for(device)
        if limits is None:
            raise LimitsError(f"no row of kernels/limits.toml matches {device!r}; give a "
                              "name containing B300, H200 or H100")
        transfer = model.on_device(limits)
    for line in check_lines(model, transfer):
        typer.echo(line)


@app.command()
def limits() -> None:
    """The physical limits table (kernels/limits.toml) with its sources."""
    from compaction_bench.kernels.limits import load_limits

    for row in load_limits():
        flops = ", ".join(f"{k} {v / 1e12:.0f} TF" for k, v in row.dense_flops.items())
        typer.echo(f"{row.name}: {row.hbm_bytes_per_s / 1e12:.2f} TB/s; dense {flops}")
        for source in row.sources:
            typer.echo(f"    source: {source}")


@app.command("device-check", context_settings={"allow_extra_args": True,
                                               "ignore_unknown_options": True})
def device_check(ctx: typer.Context) -> None:
    """The GPU device check (see `kernels/device_check.sh --help`)."""
    from compaction_bench.kernels.devicecheck import main

    raise typer.Exit(main(list(ctx.args)))

