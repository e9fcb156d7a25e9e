"""The serving commands (`compaction-bench serve|check|stop|profiles|prepare-model`): start,
check, stop and inspect vLLM servers for the suite's profiles."""

from __future__ import annotations

import os
import shlex
from typing import Annotated

import typer

from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.net import DEFAULT_PORT
from compaction_bench.common.options import (
    ConfigFile,
    FromEnv,
    ShowSettings,
    alias,
    settings_from,
    show_settings,
    words_help,
)
from compaction_bench.common.paths import run_state_dir
from compaction_bench.serve.command import profile_env, redacted
from compaction_bench.serve.engines.vllm import cpu_dtype
from compaction_bench.serve.launcher import (
    Server,
    ServerConfig,
    build_command,
    require_server,
    serve_foreground,
)
from compaction_bench.serve.model import is_hub_id, resolve_model
from compaction_bench.serve.process import stop_background
from compaction_bench.serve.profile import Profile, known_profiles, load_profile, resolve_profile
from compaction_bench.serve.replicas import (
    FleetConfig,
    check_router,
    replica_configs,
    serve_fleet,
    server_config,
)
from compaction_bench.serve.router import (
    RouterConfig,
    router_command,
)
from compaction_bench.serve.selfcheck import (
    SelfCheckError,
    SelfCheckReport,
    run_selfcheck,
    selfcheck_plan,
)
from compaction_bench.serve.settings import CheckConfig, PrepareConfig, ServeConfig, StopConfig
from compaction_bench.serve.share import NO_SHARE, HostShare, cpu_list, cpu_max

app = typer.Typer(help="Start, stop and inspect the suite's vLLM servers.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)

def _profile(name: str, speculative: bool | None, expert_parallel: bool | None,
             kv_offload: bool | None = None) -> Profile:
    return resolve_profile(name).with_features(speculative=speculative, kv_offload=kv_offload,
                                               expert_parallel=expert_parallel)


def _check(server: Server) -> SelfCheckReport:
    """The serve-time self-check of a healthy server: printed, and kept in .run/ as JSON."""
    config = server.config
    path = run_state_dir() / f"selfcheck-{config.port}.json"
    try:
        report = run_selfcheck(server.api_url, config.profile, api_key=config.api_key,
                               command=redacted(server.command))
    except SelfCheckError as exc:
        write_json_atomic(path, exc.report.to_json())
        for line in exc.report.lines():
            typer.echo(line)
        raise
    write_json_atomic(path, report.to_json())
    for line in report.lines():
        typer.echo(line)
    return report


@app.command("serve")
def serve(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("port=8100 replicas=2 fast_start=1"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    host: Annotated[str | None, alias("host")] = None,
    model: Annotated[str | None, alias("model")] = None,
    background: Annotated[bool | None, alias("background", "--background/--no-background")
                          ] = None,
    timeout_s: Annotated[float | None, alias("timeout_s", "--timeout")] = None,
    selfcheck: Annotated[bool | None, alias("selfcheck", "--selfcheck/--no-selfcheck")] = None,
    speculative: Annotated[bool | None, alias(
        "speculative", "--speculative/--no-speculative")] = None,
    expert_parallel: Annotated[bool | None, alias(
        "expert_parallel", "--expert-parallel/--no-expert-parallel")] = None,
    fast_start: Annotated[bool | None, alias("fast_start", "--fast-start/--no-fast-start")
                          ] = None,
    dry_run: Annotated[bool | None, alias("dry_run", "--dry-run/--no-dry-run")] = None,
    replicas: Annotated[int | None, alias("replicas")] = None,
    router_policy: Annotated[str | None, alias("router_policy")] = None,
    replica_cpus: Annotated[int | None, alias("replica_cpus")] = None,
    replica_cpu_quota: Annotated[float | None, alias("replica_cpu_quota")] = None,
    kv_offload: Annotated[bool | None, alias("kv_offload", "--kv-offload/--no-kv-offload")
                          ] = None,
) -> None:
    """Serve a profile: the target and compressor names from one engine, self-checked."""
    if show:
        show_settings(ServeConfig)
        return
    serve_with(settings_from(ServeConfig, "serve", words=settings, file=config_file,
                             from_env=from_env, flags=ctx.params))


def serve_with(c: ServeConfig) -> None:
    """`serve` with its settings resolved."""
    share = HostShare(cpus=c.replica_cpus, cpu_quota=c.replica_cpu_quota)
    if c.dry_run:
        typer.echo(show(c.profile, port=c.port, host=c.host, model=c.model,
                        speculative=c.speculative, expert_parallel=c.expert_parallel,
                        kv_offload=c.kv_offload,
                        share=share))
        if c.replicas > 1:
            typer.echo(show_replicas(c.profile, c.replicas, c.router_policy, port=c.port,
                                     host=c.host, share=share))
        return
    config = ServerConfig(
        profile=_profile(c.profile, c.speculative, c.expert_parallel, c.kv_offload),
        host=c.host, port=c.port,
        model=c.model or None, api_key=os.environ.get("API_KEY") or None,
        ready_timeout_s=c.timeout_s, fast_start=c.fast_start,
    )
    if c.replicas == 1:
        config = server_config(config, share)
    if c.replicas > 1:
        if c.background:
            raise typer.BadParameter("REPLICAS>1 runs in the foreground only (Ctrl-C or `make "
                                     "stop` ends it)", param_hint="--background")
        model_name = config.profile.model.target_name
        raise typer.Exit(serve_fleet(
            FleetConfig(server=config, replicas=c.replicas, policy=c.router_policy, share=share),
            check=_check if c.selfcheck else None,
            router_check=(lambda fleet: check_router(fleet, model_name, api_key=config.api_key))
            if c.selfcheck else None))
    if not c.background:
        raise typer.Exit(serve_foreground(config, after_ready=_check if c.selfcheck else None))
    server = Server(config)
    server.start()
    server.wait_ready()
    if c.selfcheck:
        try:
            _check(server)
        except BaseException:
            server.stop()
            raise
    typer.echo(f"serving {', '.join(config.profile.model.served_names)} at {server.api_url} "
               f"(pid {server.process.pid if server.process else '?'}, log {server.log_path})")


@app.command()
def check(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("port=8100 profile=cpu-tiny"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    speculative: Annotated[bool | None, alias(
        "speculative", "--speculative/--no-speculative")] = None,
    expert_parallel: Annotated[bool | None, alias(
        "expert_parallel", "--expert-parallel/--no-expert-parallel")] = None,
) -> None:
    """Self-check a running server against a profile (what `make serve` runs once healthy)."""
    if show:
        show_settings(CheckConfig)
        return
    c = settings_from(CheckConfig, "serve check", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    p = _profile(c.profile, c.speculative, c.expert_parallel)
    url = c.base_url or f"http://127.0.0.1:{c.port}"
    require_server(url)
    try:
        report = run_selfcheck(url, p, api_key=os.environ.get("API_KEY") or None)
    except SelfCheckError as exc:
        for line in exc.report.lines():
            typer.echo(line)
        raise
    for line in report.lines():
        typer.echo(line)


@app.command()
def stop(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("port=8100"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    port: Annotated[int | None, alias("port")] = None,
) -> None:
    """Stop background servers started by this checkout (all, or the one on --port)."""
    if show:
        show_settings(StopConfig)
        return
    port = settings_from(StopConfig, "stop", words=settings, file=config_file,
                         from_env=from_env, flags=ctx.params).port
    stopped = stop_background(port)
    gone: list[int] = []  # replicas whose serve process ended them first (its record went too)
    for record in list(stopped):  # a router's replicas go with it
        for replica in (record.get("router") or {}).get("replicas", []) if port else []:
            replica_port = int(str(replica.get("url", "")).rsplit(":", 1)[-1])
            found = stop_background(replica_port)
            stopped += found
            gone += [] if found else [replica_port]
    if not stopped:
        typer.echo("no server recorded in .run/" + (f" for port {port}" if port else ""))
    for record in stopped:
        if record.get("stale"):
            typer.echo(f"removed the stale record of port {record.get('port')}: pid "
                       f"{record.get('pid')} is gone or is now another process (not signalled)")
        else:
            typer.echo(f"stopped server on port {record['port']} (pid {record['pid']}, "
                       f"profile {record.get('profile')})")
    for replica_port in gone:
        typer.echo(f"replica on port {replica_port} already stopped (its serve process ended "
                   "it with the router)")


@app.command()
def profiles() -> None:
    """List the shipped profiles."""
    for name in known_profiles():
        p = load_profile(name)
        typer.echo(f"{name:32} {p.engine:4}  {p.description}")


def show(profile: str = "auto", *, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
         model: str | None = None, speculative: bool | None = None,
         expert_parallel: bool | None = None, kv_offload: bool | None = None,
         share: HostShare = NO_SHARE) -> str:
    """The exact server command, its environment and the self-check plan of a profile
    (`make serve DRY_RUN=1`): nothing is started, converted or downloaded."""
    p = _profile(profile, speculative, expert_parallel, kv_offload)
    config = server_config(ServerConfig(profile=p, port=port, host=host,
                                        api_key="***" if os.environ.get("API_KEY") else None),
                           share)
    f = p.features
    spec = ("none in the recipe" if f.speculative is None else
            f"{'ON' if f.speculative.enabled else 'off'} ({f.speculative.config}; SPECULATIVE=1 / "
            "--speculative turns it on)")
    offload = ("none verified by the recipe" if f.kv_offload is None else
               f"{'ON' if f.kv_offload.enabled else 'off'} ({f.kv_offload.config['kv_connector']}"
               "; KV_OFFLOAD=1 turns it on)")
    source = model or p.model.source
    lines = [f"# {p.name}: {p.description}",
             f"# model: {source} ({p.model.size_note})"]
    if is_hub_id(source):
        revision = p.model.revision if source == p.model.source else None
        at = f" --revision {revision}" if revision else ""
        lines.append(f"#   not downloaded at run time; fetch it first: hf download {source}{at}")
        lines.append(f"#   checkpoint: pinned to commit {revision} ({p.model.revision_source})"
                     if revision else "#   checkpoint: NOT pinned: vLLM loads whatever the local "
                     "cache's main points at (the run's manifest records that commit); pin "
                     "model.revision in the profile")
    dtype_note = cpu_dtype(p)[1] if p.server_name == "vllm" else None
    if dtype_note:
        lines.append(f"# {dtype_note}")
    lines += [
        f"# vLLM: minimum {p.vllm.minimum} ({p.vllm.minimum_reason})",
        f"#       pinned {p.vllm.pinned} ({p.vllm.pinned_reason})",
        f"# opt-in features: speculative decoding {spec}; expert parallelism "
        f"{'ON' if f.expert_parallel else 'off'}; KV offload {offload}",
        f"# live agents sample: {sampling_text(p)}",
        f"# regimes: shared {p.regimes.shared_users} users, overloaded {p.overloaded_users} "
        f"users, max_num_seqs {p.engine_args.max_num_seqs}",
        "# environment and command:"]
    lines += [f"{key}={shlex.quote(value)} \\" for key, value in profile_env(p).items()]
    lines.append(shlex.join(build_command(config, source)))
    lines.append("# self-check, after /health and before any block or sweep:")
    lines += [f"#   {i}. {line}" for i, line in enumerate(selfcheck_plan(p), 1)]
    return "\n".join(lines)


def sampling_text(p: Profile) -> str:
    """A live agent's sampling on the profile, and where it comes from."""
    if p.sampling is None:
        return ("the suite's fallback, temperature 0.7 with tool calls, 1.0 with text actions "
                "(the profile names no model card's values)")
    sampled = ", ".join(f"{name} {value:g}" for name, value in (
        ("temperature", p.sampling.temperature), ("top_p", p.sampling.top_p),
        ("top_k", p.sampling.top_k)) if value is not None)
    return f"{sampled} ({p.sampling.source})"


def show_replicas(profile: str, replicas: int, policy: str, *, port: int = DEFAULT_PORT,
                  host: str = "127.0.0.1", share: HostShare = NO_SHARE) -> str:
    """What `make serve REPLICAS=n DRY_RUN=1` adds: each replica's port and pinning, and the
    router's command."""
    base = ServerConfig(profile=resolve_profile(profile), port=port, host=host)
    configs = replica_configs(base, replicas, share=share)
    lines = [f"# {replicas} replicas of the command above, each with its own port and share:"]
    for c in configs:
        pin = (f"taskset -c {cpu_list(c.cpus)}, VLLM_CPU_OMP_THREADS_BIND={cpu_list(c.cpus)}"
               if c.cpus else f"CUDA_VISIBLE_DEVICES={','.join(map(str, c.gpu_ids))}"
               if c.gpu_ids else "not pinned")
        quota = (f", cgroup cpu quota {cpu_max(c.cpu_quota)} ({c.cpu_quota:g} CPU)"
                 if c.cpu_quota is not None else "")
        lines.append(f"#   --port {c.port}: {pin}{quota}")
    router = RouterConfig(worker_urls=tuple(c.server_url for c in configs), policy=policy,
                          host=host, port=port)
    lines.append("# and vLLM's router in front of them, on PORT:")
    lines.append(shlex.join(router_command(router, binary="vllm-router")))
    return "\n".join(lines)


@app.command("prepare-model")
def prepare_model(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("profile=cpu-tiny"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
) -> None:
    """Make the profile's model ready locally (converts an embedded model once)."""
    if show:
        show_settings(PrepareConfig)
        return
    c = settings_from(PrepareConfig, "prepare-model", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    typer.echo(resolve_model(resolve_profile(c.profile).model.source))

