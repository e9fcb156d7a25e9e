"""The bench's one typed config, built by the CLI from `make bench` variables."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.net import server_url
from common.paths import results_dir
from serve.profile import Profile

Regime = Literal["dedicated", "shared", "overloaded"]
REGIMES: tuple[Regime, ...] = ("dedicated", "shared", "overloaded")
# The study's block counts (Appendix E.2) on GPU profiles; on the CPU default one overloaded
# block must finish in a few minutes on 2 cores.
DEFAULT_BLOCKS = {
    "cuda": {"dedicated": 5, "shared": 5, "overloaded": 25},
    "cpu": {"dedicated": 2, "shared": 2, "overloaded": 1},
}


class BenchConfig(BaseModel):
    """Everything one bench run needs. Stored whole in the run's manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regime: Regime
    blocks: int | None = Field(default=None, gt=0, description="default: per engine, above")
    profile: str = "auto"
    port: int = 8000
    server_url: str | None = Field(
        default=None, description="measure this server (BASE_URL, with or without /v1) "
        "instead of starting the profile's")

    @field_validator("server_url", "external_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else server_url(value)
    task: str = "fix-median"
    arms: tuple[str, ...] = ("clean", "external", "self")
    seed: int = 0
    run_id: str | None = None
    resume: str | None = None
    recover: bool = False
    locust_workers: int = Field(default=0, ge=0)
    step_limit: int | None = Field(default=None, gt=0)
    results_dir: str = Field(default_factory=lambda: str(results_dir()))
    external_url: str | None = Field(
        default=None, description="the external compressor's /v1 URL; default on CPU: the "
        "embedded Gemma server (cpu-gemma-compressor) on port + 1, started when needed")
    prompt: str = "telegraphic"
    cache_salt_per_arm: bool = Field(
        default=False, description="isolate each arm's prefix cache with vLLM's cache_salt")


def regime_users(regime: Regime, profile: Profile) -> int:
    """Background users for a regime, from the profile: none, below, above max_num_seqs."""
    if regime == "dedicated":
        return 0
    if regime == "shared":
        return profile.regimes.shared_users
    return profile.overloaded_users


def default_blocks(regime: Regime, profile: Profile) -> int:
    return DEFAULT_BLOCKS[profile.engine][regime]
