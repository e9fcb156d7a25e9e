"""`make gpu-check PROFILE=...`: a GPU owner's first hour in one command (issue 32).

In order, on one server of the profile (started here, or BASE_URL):

1. the GPUs NVML sees against the profile's count (skipped: no GPU, on a machine without one);
2. the serve-time self-check (serve/selfcheck.py): served names and which model answers, the
   prefix cache on a repeated and a branched prompt, /metrics, the reasoning parser and tool
   calls on real requests, the server's version and cache config;
3. two replay blocks of the study's recordings (`make bench SOURCE=replay BLOCKS=2`), whose run
   folder also carries the NVML telemetry the bench samples (power and energy per GPU, checked
   here: skipped: no GPU, where there is none);
4. one live-agent block (`make bench SOURCE=agent BLOCKS=1`): the agent, its tools and its box.

Each step is a row of gpu-check.md (and gpu-check.json) in results/<run-id>/: passed, failed,
or skipped with the reason in one line. A failed step does not stop the later ones, so one run
shows everything that is wrong. The exit code is 1 where any step failed.

The same code runs on the CPU default (cpu-tiny; `make gpu-check` there takes minutes), where
the GPU rows say "skipped: no GPU". docs/serving.md says what it does on a GPU and that it has
not yet been run on one by this project.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import Field

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.files import read_jsonl, write_json_atomic, write_text_atomic
from compaction_bench.common.markdown import table
from compaction_bench.common.paths import results_dir
from compaction_bench.serve.hardware import Gpu, detect_gpus
from compaction_bench.serve.launcher import ServerConfig, server_for
from compaction_bench.serve.profile import Profile, resolve_profile
from compaction_bench.serve.selfcheck import SelfCheckError, run_selfcheck
from compaction_bench.serve.settings import ServerTarget

NO_GPU = "skipped: no GPU"


class GpuCheckConfig(ServerTarget):
    """What `make gpu-check` checks, and where: a profile's server (started on `port` where
    nothing answers), or the running one at `base_url`."""

    run_id: str | None = Field(default=None, description="the check's folder under "
                               "results/ (default: gpu-check-<time>)")
    replay_blocks: int = Field(default=2, ge=1, description="replay blocks of the study's "
                               "recordings")
    agent_blocks: int = Field(default=1, ge=0, description="live-agent blocks (0 skips them)")
    task: str = Field(default="fix-median", description="the live agent's task")


@dataclass(frozen=True)
class Step:
    """One row of the checklist."""

    check: str
    status: str  # pass | fail | skipped: <why>
    detail: str


def run_gpu_check(config: GpuCheckConfig, say: Callable[[str], None]) -> tuple[Path, list[Step]]:
    """Every step (module docstring); returns the check's folder and its rows."""
    from compaction_bench.bench.run.runner import run_bench

    run_id = config.run_id or time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out = results_dir() / run_id
    out.mkdir(parents=True, exist_ok=True)
    profile = resolve_profile(config.profile)
    steps: list[Step] = []

    def add(step: Step) -> None:
        steps.append(step)
        say(f"[gpu-check] {step.check}: {step.status} ({step.detail})")

    gpus = detect_gpus()
    if profile.engine != "cuda":
        add(Step("GPUs", NO_GPU if not gpus else "skipped: a CPU profile",
                 f"profile {profile.name} runs on {profile.engine}; NVML sees {len(gpus)}"))
    elif len(gpus) >= profile.gpus:
        add(Step("GPUs", "pass", f"{len(gpus)} x {gpus[0].name} ({gpus[0].memory_gib:.0f} GiB, "
                 f"driver {gpus[0].driver}); the profile needs {profile.gpus}"))
    else:
        add(Step("GPUs", "fail", f"NVML sees {len(gpus)}; the profile needs {profile.gpus}"))
    server = ServerConfig(profile=profile, port=config.port)
    with server_for(server, config.base_url) as url:
        add(_selfcheck(url, profile))
        replay = BenchConfig(regime="dedicated", source="replay", profile=profile.name,
                             base_url=url, blocks=config.replay_blocks, run_id=f"{run_id}-replay",
                             results_dir=str(out), selfcheck=False)
        add(_bench("replay", lambda: run_bench(replay, stream=_Said(say)),
                   out / f"{run_id}-replay"))
        add(_telemetry(out / f"{run_id}-replay", gpus))
        if config.agent_blocks:
            agent = BenchConfig(regime="dedicated", source="agent", profile=profile.name,
                                base_url=url, blocks=config.agent_blocks, task=config.task,
                                run_id=f"{run_id}-agent", results_dir=str(out), selfcheck=False)
            add(_bench("live agent", lambda: run_bench(agent, stream=_Said(say)),
                       out / f"{run_id}-agent"))
        else:
            add(Step("live agent", "skipped: agent_blocks=0", "not asked for"))
    write_json_atomic(out / "gpu-check.json", {
        "schema": "compbench.gpu_check", "profile": profile.name, "run_id": run_id,
        "steps": [asdict(s) for s in steps]})
    write_text_atomic(out / "gpu-check.md", _markdown(profile.name, run_id, steps))
    return out, steps


class _Said(io.StringIO):
    """A run's progress lines, passed on as they are written."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__()
        self.say = say

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self.say(line)
        return len(text)


def _selfcheck(url: str, profile: Profile) -> Step:
    try:
        report = run_selfcheck(url, profile)
    except SelfCheckError as exc:
        failed = [c for c in exc.report.checks if c.status == "fail"]
        return Step("self-check", "fail", "; ".join(f"{c.name}: {c.detail}" for c in failed))
    names = ", ".join(c.name for c in report.checks if c.status == "pass")
    return Step("self-check", "pass", f"passed: {names}")


def _bench(what: str, run: Callable[[], object], folder: Path) -> Step:
    try:
        outcome = run()
    except Exception as exc:  # a step that cannot run is a failed row; the next ones still run
        return Step(what, "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    arms = read_jsonl(folder / "arms.jsonl").objects
    complete = [a for a in arms if a.get("status") == "complete"]
    aborted = getattr(outcome, "aborted", None)
    status = "pass" if arms and len(complete) == len(arms) and not aborted else "fail"
    errors = sorted({str(a.get("error")).splitlines()[0] for a in arms
                     if a.get("status") != "complete"})
    detail = (f"{len(complete)}/{len(arms)} arm attempts complete in {folder}"
              + (f"; first error: {errors[0]}" if errors else "")
              + (f"; aborted: {aborted}" if aborted else ""))
    return Step(what, status, detail)


def _telemetry(folder: Path, gpus: list[Gpu]) -> Step:
    path = folder / "gpu.jsonl"
    lines = read_jsonl(path).objects
    readings = [x for x in lines if x.get("power_w") is not None]
    if not gpus:
        off = next((x.get("reason") for x in lines if x.get("telemetry") == "off"), None)
        return Step("NVML telemetry", NO_GPU, f"the bench recorded telemetry off: {off}"
                    if off else "no gpu.jsonl line")
    if readings:
        joules = [x["energy_j"] for x in readings if x.get("energy_j") is not None]
        return Step("NVML telemetry", "pass", f"{len(readings)} power readings in {path}"
                    + (", energy counters moving" if len(set(joules)) > 1 else ""))
    return Step("NVML telemetry", "fail", f"a GPU is present but {path} has no power reading")


def _markdown(profile: str, run_id: str, steps: list[Step]) -> str:
    failed = [s.check for s in steps if s.status == "fail"]
    verdict = ("every step passed or was skipped" if not failed
               else f"failed: {', '.join(failed)}")
    lines = [f"# GPU check: {profile}", "",
             f"`make gpu-check` run {run_id}: {verdict}. A skipped step says why; the run "
             "folders of the two bench steps sit beside this file.", ""]
    lines += table(("check", "status", "detail"),
                   [(s.check, s.status, s.detail) for s in steps])
    return "\n".join(lines) + "\n"


def exit_code(steps: list[Step]) -> int:
    return 1 if any(s.status == "fail" for s in steps) else 0
