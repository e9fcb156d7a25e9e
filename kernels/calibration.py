"""One calibration run (`make kernels`): micro-benchmarks, server probes, fits, results file.

Order: the server is checked first (a dead BASE_URL fails before a minute of benchmarks; with
no server on the port a profile server is started, as `make bench` does), then the
micro-benchmarks run (the server idle), then the probes, then the fits. The results file
(kernels/SCHEMA.md) holds every measurement, every probe request's raw record, the fits and
the provenance; its name is `<device>__<model>__<engine>.json` in data/kernels/.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from compaction_bench.common.provenance import cpu_model, host_facts
from compaction_bench.kernels.costmodel import fit_phases
from compaction_bench.kernels.fitreport import fit_lines
from compaction_bench.kernels.limits import DeviceLimits
from compaction_bench.kernels.measurement import HEADER, row
from compaction_bench.kernels.resultfile import (
    file_name,
    kernel_results_dir,
    new_document,
    write_results,
)
from compaction_bench.kernels.shapes import shape_for_profile
from compaction_bench.serve.settings import ServerTarget

Say = Callable[[str], None]


class CalibrationConfig(ServerTarget):
    """What `kernels run` does (`make kernels` variables; common/options.py): it probes the
    target server."""

    out_dir: Path | None = Field(default=None, description="where the results file goes "
                                 "(default data/kernels/)")
    micro: bool = Field(default=True, description="run the micro-benchmarks")
    probe: bool = Field(default=True, description="probe the server and fit the cost model")
    quick: bool = Field(default=False, description="a 2-3 level probe (a first look, tests)")
    seed: int | None = Field(default=None, ge=0, description="prompt generator seed (default: "
                             "fresh, so no earlier run's cache is hit)")
    threads: int | None = Field(default=None, ge=1, description="CPU threads for the "
                                "micro-benchmarks (default 1 on a CPU; see kernels/micro.py)")


def device_facts() -> dict[str, Any]:
    """What device the micro-benchmarks run on, named for the results file."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return {"type": "cuda", "name": name, "slug": name, "count": torch.cuda.device_count()}
    host = host_facts()
    return {"type": "cpu", "name": f"{cpu_model()} ({host['cpus_usable']} CPUs usable)",
            "slug": f"cpu-{cpu_model()}-{host['cpus_usable']}c", "cpu": cpu_model(),
            "cpus_usable": host["cpus_usable"]}


@contextlib.contextmanager
def _server(config: CalibrationConfig, profile: Any) -> Iterator[str | None]:
    if not config.probe:
        yield None
        return
    from compaction_bench.serve.launcher import ServerConfig, require_server, server_for

    if config.base_url:
        require_server(config.base_url)
    with server_for(ServerConfig(profile=profile, port=config.port), config.base_url) as api:
        yield api


def calibrate(config: CalibrationConfig, *, argv: list[str], say: Say = print) -> Path:
    """Run the calibration (module docstring); returns the results file written."""
    import torch

    from compaction_bench.kernels.micro import MicroConfig, run_micro
    from compaction_bench.serve.profile import resolve_profile

    profile = resolve_profile(config.profile)
    shape = shape_for_profile(profile.name)
    seed = config.seed if config.seed is not None else secrets.randbelow(2**31)
    device = device_facts()
    document = new_document("calibration", device, argv, seed=seed, profile=profile.name,
                            config=config.model_dump(mode="json"))
    document["model"] = {"profile": profile.name, "name": shape.name,
                         "source": profile.model.source, "shape": shape.to_json()}
    engine_slug = f"torch-{torch.__version__}"
    limits: DeviceLimits | None = None
    with _server(config, profile) as api:
        if config.micro:
            micro = (MicroConfig.gpu((shape,)) if device["type"] == "cuda"
                     else MicroConfig.cpu(shape, threads=config.threads or 1))
            say(f"[micro] {device['name']}: {shape.name} shapes; "
                + ("rows follow as measured" if device["type"] == "cuda" else
                   "a CPU's limits are its own best samples, so rows follow at the end"))
            say(HEADER)
            limits, found = run_micro(micro, device_name=device["name"],
                                      echo=lambda m: say(row(m)))
            document["limits"] = limits.to_json() if limits is not None else None
            document["micro"] = {"config": micro.to_json(),
                                 "measurements": [m.to_json() for m in found]}
        if api is not None:
            document["engine"], document["probes"] = _probe(config, profile, api, seed, say)
            engine_slug = document["engine"]["slug"]
            levels = {phase: document["probes"][phase]["levels"]
                      for phase in ("prefill", "decode")}
            document["fits"] = fit_phases(levels, shape, limits, seed=seed)
            for line in fit_lines(document["fits"]):
                say(line)
    model_slug = shape.name if (config.probe or config.micro) else "none"
    path = (config.out_dir or kernel_results_dir()) / file_name(device["slug"], model_slug,
                                                         engine_slug)
    write_results(document, path)
    say(f"[kernels] wrote {path}")
    return path


def _probe(config: CalibrationConfig, profile: Any, api: str, seed: int,
           say: Say) -> tuple[dict[str, Any], dict[str, Any]]:
    from compaction_bench.kernels.probe import (
        ProbeConfig,
        decode_levels,
        default_sweep,
        prefill_levels,
        server_facts,
    )
    from compaction_bench.serve.endpoints import server_version

    sweep = default_sweep(profile.engine, profile.engine_args.max_num_seqs, quick=config.quick)
    probe = ProbeConfig(api_url=api, model=profile.model.target_name, seed=seed, **sweep)
    rng = np.random.default_rng(seed)
    facts = server_facts(probe, rng)
    version = server_version(api)
    engine = {"name": "vllm" if version else "openai-compatible", "version": version,
              "slug": f"vllm-{version}" if version else "openai-compatible",
              "api_url": api, "facts": facts.to_json(),
              "max_num_seqs": profile.engine_args.max_num_seqs}
    say(f"[probe] {api}: {engine['name']} {version or ''}, KV block {facts.block_size} tokens, "
        f"chat template {facts.header_tokens}+{facts.trailer_tokens} tokens, seed {seed}")
    prefill_requests, prefill = prefill_levels(probe, facts, rng, say)
    decode_requests, decode = decode_levels(probe, facts, rng, say)
    probes = {"config": probe.model_dump(mode="json"), "prefill": {"levels": prefill},
              "decode": {"levels": decode}, "requests": prefill_requests + decode_requests}
    return engine, probes

