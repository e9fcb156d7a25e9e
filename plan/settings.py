"""The planner's one typed config (`make plan` variables) and its latency target.

An SLO is `p<q>:<value>s` (the q-th percentile of postfork marginal time at most that many
seconds, `p90:120s`) or `p<q>:<factor>x` (at most `factor` times the reference arm's q-th
percentile at its lowest measured level: "an agent in the fleet may take at most twice as long
as alone", `p90:2x`, the default, which fits any hardware).

The time an SLO bounds is, by default, the wall time the agent sees: postfork time plus the
rewriting it waits through inline (`wall`, the cycle); `postfork` bounds postfork time alone,
which leaves an inline rewriter's own waits out (issue 22: a self arm planned at a 150 s SLO
ran at 155 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compaction_bench.common import slo as common_slo
from compaction_bench.common.errors import SuiteError
from compaction_bench.common.resampling import CONFIDENCE, RESAMPLES
from compaction_bench.common.slo import Slo

DEFAULT_SLO = "p90:2x"
DEFAULT_AGENTS = 100
SloTime = Literal["wall", "postfork"]
DEFAULT_SLO_TIME: SloTime = "wall"
DEFAULT_EXTRAPOLATION = 2.0


class PlanError(SuiteError):
    """Bad planner input (an SLO, a run folder without usable records); the message names the
    value and the fix."""


def parse_slo(text: str) -> Slo:
    """`p90:120s`, `p90:120` (seconds) or `p90:2x` (the grammar's one home: common/slo.py);
    raises PlanError naming the value."""
    try:
        return common_slo.parse_slo(text)
    except common_slo.SloError as exc:
        raise PlanError(str(exc)) from None


class PlanConfig(BaseModel):
    """Everything one plan needs. Stored whole in `plan.json`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: Path = Field(description="the run folder planned (the command's RUN_DIR)")
    slo: str = Field(default=DEFAULT_SLO, description="latency target: p90:120s (seconds) or "
                     "p90:2x (times the reference arm alone)")
    agents: int = Field(default=DEFAULT_AGENTS, gt=0, description="fleet size to plan GPUs for")
    slo_time: SloTime = Field(
        default=DEFAULT_SLO_TIME, description="the time the SLO bounds: wall (postfork plus "
        "inline rewriting, what the agent waits) or postfork (module docstring)")
    extrapolation: float = Field(
        default=DEFAULT_EXTRAPOLATION, ge=1.0, description="how far past the largest measured "
        "level the plan extrapolates, as a multiple of it; beyond: '> N', never a number")
    gpu_hour_usd: float | None = Field(
        default=None, gt=0, description="price of one GPU-hour; without it costs are GPU-seconds")
    compressor_usd_per_mtok: float | None = Field(
        default=None, ge=0, description="price of the external compressor per million tokens "
        "(prompt + completion)")
    bootstrap: int = Field(default=RESAMPLES, ge=100,
                           description="bootstrap resamples for every interval")
    confidence: float = Field(default=CONFIDENCE, gt=0.5, lt=1,
                              description="coverage of every interval")
    seed: int = Field(default=0, ge=0, description="seed of the bootstrap and the simulator")
    costmodel: Path | None = Field(
        default=None, description="a kernels results file (kernels/SCHEMA.md): the fleet "
        "simulator predicts levels the sweep did not measure")
    predict_device: str | None = Field(
        default=None, description="with costmodel: also predict on this GPU (a row of "
        "kernels/limits.toml, by the roofline's transfer; unvalidated)")
    fleet_replicas: tuple[int, ...] = Field(
        default=(2,), description="replicas of the fleets the fleet model plans (plan."
        "fleetmodel), e.g. 2,4,8; none plans none")
    fleet_policies: tuple[str, ...] = Field(
        default=("round_robin", "consistent_hash"), description="vllm-router policies the "
        "fleet model plans each fleet under")
    replica_urls: tuple[str, ...] | None = Field(
        default=None, description="the fleet's replica server URLs, for consistent_hash's ring "
        "(default: those of `make serve REPLICAS=R` on port 8000)")
    plots: bool = Field(default=True, description="draw plots/plan_*.png (0: the tables only)")

    @field_validator("fleet_replicas", mode="before")
    @classmethod
    def _no_fleet(cls, value: object) -> object:
        """FLEET_REPLICAS=none plans no fleet (an empty variable means: the default)."""
        if value == "none" or (isinstance(value, list | tuple) and list(value) == ["none"]):
            return ()
        return value

    @field_validator("fleet_replicas")
    @classmethod
    def _replicas(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if bad := [r for r in value if r < 1]:
            raise ValueError(f"FLEET_REPLICAS: {bad[0]} replicas; give 1 or more (e.g. 2,4,8)")
        return tuple(sorted(set(value)))

    @field_validator("fleet_policies")
    @classmethod
    def _policies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from compaction_bench.serve.router import offered_policies

        return offered_policies(value, "FLEET_POLICIES")

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: str) -> str:
        parse_slo(value)
        return value

    @property
    def target(self) -> Slo:
        return parse_slo(self.slo)


class PlanCheckConfig(BaseModel):
    """`make plan-check`'s own settings; the check itself takes the plan's (its plan.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int | None = Field(default=None, ge=1, description="replicas behind the router, "
                                 "where the check runs' manifests do not say")
