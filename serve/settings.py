"""`compaction-bench serve`'s one typed config (`make serve` variables).

Given as the bench's settings are (common/settings.py): `name=value` words
(`compaction-bench serve port=8100 replicas=2`), a TOML file (`--config serve.toml`), make's
variables (`make serve PORT=8100 REPLICAS=2`, through `--from-env`) and `COMPBENCH_<NAME>`
anywhere. The flags users know (`--port`, `--fast-start`, ...) stay, as aliases of the same
fields: a flag given overrides every other layer.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compaction_bench.common.net import DEFAULT_PORT
from compaction_bench.serve.router import DEFAULT_POLICY, ROUTER_POLICIES, policy_refusal


class ServerTarget(BaseModel):
    """The server a command talks to (histories, kernels): a profile's, started on `port` where
    nothing answers there, or any OpenAI-compatible server at `base_url`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(default="auto", description="server profile name or .toml path; "
                         "'auto': the one for this machine")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="the profile server's "
                      "port (started there where nothing answers)")
    base_url: str | None = Field(default=None, description="use this OpenAI-compatible server "
                                 "instead (with or without /v1)")


class CheckConfig(ServerTarget):
    """What `compaction-bench serve check` self-checks: a running server against a profile."""

    speculative: bool | None = Field(
        default=None, description="the server runs the profile's opt-in speculative decoding; "
        "unset: as the profile says (off)")
    expert_parallel: bool | None = Field(
        default=None, description="the server runs opt-in expert parallelism; unset: as the "
        "profile says (off)")


class PrepareConfig(BaseModel):
    """Whose model `compaction-bench prepare-model` makes ready."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(default="auto", description="profile name or .toml path; 'auto': the "
                         "one for this machine")


class StopConfig(BaseModel):
    """What `compaction-bench stop` stops: every background server of this checkout, or one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int | None = Field(default=None, ge=1, le=65535, description="only the server (or "
                             "router, with its replicas) on this port; unset: all")


class ServeConfig(BaseModel):
    """What `make serve` starts: one server of a profile, or replicas behind vLLM's router."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(default="auto", description="profile name or .toml path; 'auto' picks "
                         "one for this machine (cpu-tiny without a GPU)")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="TCP port (the router's "
                      "with replicas > 1; the replicas take port+2..)")
    host: str = Field(default="127.0.0.1", description="bind address; loopback unless told "
                      "otherwise")
    model: str | None = Field(default=None, description="override the profile's model source "
                              "(a local folder, or a Hugging Face id already cached)")
    background: bool = Field(default=False, description="return once healthy and "
                             "self-checked; `stop` ends it (one server only)")
    timeout_s: float | None = Field(default=None, ge=1, description="seconds to wait for "
                                    "/health; default: the profile's (900, or its vLLM "
                                    "engine-ready limit + 300)")
    selfcheck: bool = Field(default=True, description="run the self-check once healthy; a "
                            "failure stops the server")
    speculative: bool | None = Field(
        default=None, description="the profile's opt-in speculative decoding (MTP / EAGLE); "
        "unset: as the profile says (off)")
    expert_parallel: bool | None = Field(
        default=None, description="opt-in expert parallelism (TP >= 2); unset: as the profile "
        "says (off)")
    kv_offload: bool | None = Field(
        default=None, description="the profile's opt-in KV-cache offload (vLLM's "
        "OffloadingConnector to CPU memory, as its recipe verifies it); unset: as the profile "
        "says (off)")
    fast_start: bool = Field(
        default=False, description="--optimization-level 0: no compilation, a faster cold "
        "start and slower steps (not for measurements; marked in a run)")
    dry_run: bool = Field(
        default=False, description="print the exact server command, its environment and the "
        "self-check plan; start, convert and download nothing")
    replicas: int = Field(default=1, ge=1, description="this many servers of the profile on "
                          "port+2.. (each on its own CPUs or GPUs) behind vLLM's router on port")
    router_policy: str = Field(default=DEFAULT_POLICY, description="with replicas > 1: one of "
                               + ", ".join(ROUTER_POLICIES))
    replica_cpus: int | None = Field(
        default=None, ge=1, description="each replica's CPU set of this many CPUs, one server "
        "alone included, the rest left to the client and router (recorded in a run's "
        "manifest); unset: one server unpinned, replicas > 1 split the CPUs")
    replica_cpu_quota: float | None = Field(
        default=None, ge=0.01, description="each replica's cgroup CPU quota in CPUs (0.9 = 90% "
        "of one CPU), in a cgroup of its own removed when it stops; unset: none")

    @field_validator("router_policy")
    @classmethod
    def _offered(cls, policy: str) -> str:
        if policy not in ROUTER_POLICIES:
            raise ValueError(policy_refusal(policy))
        return policy
