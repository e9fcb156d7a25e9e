"""The bench's one typed config and the choices it makes for a profile (block counts,
background users, seeds, protocol strictness).

Every setting is declared here once; `common.settings` derives its other names: the run file's
key (`regime = "overloaded"`, `[sweep] levels = [1, 2]`), the command line's word
(`regime=overloaded`) and the make variable (`make bench REGIME=overloaded SWEEP_LEVELS=1,2`).
`compaction-bench bench --settings` lists them all."""

from __future__ import annotations

import zlib
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.net import DEFAULT_PORT, server_url
from compaction_bench.common.paths import results_dir
from compaction_bench.common.slo import parse_slo
from compaction_bench.serve.profile import Profile

Regime = Literal["dedicated", "shared", "overloaded", "sweep", "search"]
REGIMES: tuple[Regime, ...] = ("dedicated", "shared", "overloaded")
# Not a regime around a block: closed-loop fleets of N agents of one arm (bench/run/sweep.py).
SWEEP: Regime = "sweep"
# The sweep's cells chosen one at a time: per arm, the largest fleet whose SLO holds
# (bench/run/search.py).
SEARCH: Regime = "search"
# The study's block counts (Appendix E.2) on GPU profiles; on the CPU default one overloaded
# block must finish in a few minutes on 2 cores.
DEFAULT_BLOCKS = {
    "cuda": {"dedicated": 5, "shared": 5, "overloaded": 25},
    "cpu": {"dedicated": 2, "shared": 2, "overloaded": 1},
    "fake": {"dedicated": 2, "shared": 2, "overloaded": 1},
}
# Replay on a CPU: enough dedicated blocks for a real 95% interval (6 is the fewest whose
# order-statistic interval of a median covers 95%: bench/analysis/stats.py) in a first run of
# minutes.
# Measured continuations per arm and level of a sweep, by default: on GPU profiles, where a plan
# buys hardware, what the plan's leave-one-level-out (LOLO) error needs: on synthetic truth it
# is <= 6% for interior levels in 87-97% of seeds at 32 per level, in 68-80% at 8 (issue 29;
# docs/planning.md, "how far it reaches"); plan.md warns below it. On CPU and the fake engine,
# 8: they test the machinery, and a cpu-tiny level of 32 continuations takes most of an hour.
LOLO_CONTINUATIONS = 32
SWEEP_CONTINUATIONS = {"cuda": LOLO_CONTINUATIONS, "cpu": 8, "fake": 8}
DEFAULT_REPLAY_BLOCKS = {"dedicated": 6, "shared": 6, "overloaded": 2}
# Arm names that are not compaction policies: the reference, and a copy of its history under
# another name, with its own sampling seed and cache salt (`arm_seed`, `cache_salt`): an A/A,
# whose interval must cover 0 and whose spread is the noise of two independent continuations.
REFERENCE = "clean"
PLACEBO = "placebo"
AGENT_ARMS = ("clean", "external", "self")
# replay: clean, the study's rewritten branch (recorded behaviour) and the rewritten history with
# clean's recorded turns (history only): the pair that splits the effect in two
REPLAY_ARMS = ("clean", "external", "external-history")
REPLAY_ONLY_ARMS = ("external-history",)


# The settings that make a run what it is: a resumed run takes them from its manifest.
RUN_SETTINGS = ("regime", "source", "records", "side_by_side", "tool_time", "task", "arms",
                "seed", "seeds", "cache", "protocol", "rewrite_cache", "step_limit", "prompt",
                "blocks", "repeat", "external_url", "locust_workers", "locust_remote_workers",
                "locust_master", "background_max_tokens", "speculative", "expert_parallel",
                "kv_offload",
                "stream_deadline_s", "compressor_deadline_s", "arm_wall_s", "sweep",
                "fast_start", "token_ids", "router_policy", "slo", "search")


class BenchError(SuiteError):
    """A run cannot start or had to stop; the message says why and what to do."""



class SweepSettings(BaseModel):
    """The load-response sweep (`REGIME=sweep`, bench/run/sweep.py): for each arm alone and each
    level N, a closed-loop fleet of N agents continuing from the fork again and again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    levels: tuple[int, ...] | None = Field(
        default=None, description="fleet sizes N (e.g. 1,2,4); default: powers of two up to "
        "2 x max_num_seqs, and max_num_seqs itself")
    min_continuations: int | None = Field(
        default=None, gt=0, description="measured continuations per arm and level at least; "
        "each agent runs ceil(this / N) of them; default 32 on GPU profiles (what the plan's "
        "leave-one-level-out error needs, docs/planning.md), 8 on CPU and the fake engine")
    level_s: float = Field(
        default=0.0, ge=0, description="each agent keeps starting measured continuations until "
        "the level has run this long")
    warmup: int = Field(default=1, ge=0, description="each agent's first continuations per "
                        "level, recorded and flagged, excluded from the plan")

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value or any(n <= 0 for n in value):
            raise ValueError(f"levels must be positive fleet sizes, got {list(value)} "
                             "(e.g. SWEEP_LEVELS=1,2,4,8)")
        return tuple(sorted(set(value)))

    @property
    def continuations(self) -> int:
        """`min_continuations`, resolved for the run's profile (`BenchConfig.for_profile`)."""
        if self.min_continuations is None:
            raise BenchError("the sweep's continuations per level come from the profile: "
                             "resolve the config with BenchConfig.for_profile, or set "
                             "SWEEP_MIN_CONTINUATIONS")
        return self.min_continuations

    def levels_for(self, max_num_seqs: int) -> tuple[int, ...]:
        """The levels given, or 1, 2, 4, ... up to 2 x max_num_seqs with max_num_seqs itself."""
        if self.levels is not None:
            return self.levels
        top = 2 * max_num_seqs
        found = {max_num_seqs, top}
        n = 1
        while n < top:
            found.add(n)
            n *= 2
        return tuple(sorted(found))


class SearchSettings(BaseModel):
    """Capacity in one run (`REGIME=search`, bench/run/search.py): per arm, levels probed up by
    doubling, bisected, and the boundary confirmed with more continuations. A probe or bisection
    cell runs as a sweep cell does (`sweep.min_continuations`, `sweep.warmup`,
    `sweep.level_s`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_level: int | None = Field(
        default=None, gt=0, description="the largest fleet tried; an arm that still meets "
        "the SLO there is 'unbounded up to' it; default 2 x max_num_seqs")
    confirm_continuations: int = Field(
        default=40, gt=0, description="measured continuations of each of the two boundary "
        "levels when they run again to confirm the boundary (a p90's 95% order-statistic "
        "interval has an upper end from 36 on)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="coverage of each "
                              "level's order-statistic interval of the SLO quantile")

    def max_for(self, max_num_seqs: int) -> int:
        return self.max_level or 2 * max_num_seqs


class BenchConfig(BaseModel):
    """Everything one bench run needs. Stored whole in the run's manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regime: Regime = Field(default="dedicated", description="dedicated, shared, overloaded "
                           "(the load around each block), sweep (the load-response sweep) or "
                           "search (per arm, the largest fleet meeting SLO)")
    blocks: int | None = Field(default=None, gt=0, description="how many blocks (default "
                               "dedicated/shared/overloaded: 5/5/25 on GPU profiles; on CPU "
                               "6/6/2 for replay, 2/2/1 for agents)")
    repeat: int = Field(default=1, ge=1, le=20, description="run the same configuration "
                        "this many times, interleaved block by block (run 1's block 1, run 2's "
                        "block 1, ..., run 1's block 2, ...): each run's block j has block j's "
                        "seeds and record, its own cache; the report shows the spread between "
                        "the runs beside the interval (blocks stays per run)")
    profile: str = Field(default="auto", description="server profile, or 'auto' for this "
                         "machine")
    port: int = Field(default=DEFAULT_PORT, gt=0, lt=65536, description="the port of the "
                      "server the run starts (the embedded compressor takes port + 1)")
    base_url: str | None = Field(
        default=None, description="measure the server at this URL (with or without /v1) "
        "instead of starting the profile's")
    replica_urls: tuple[str, ...] = Field(
        default=(), description="the replicas behind the router at BASE_URL (their server "
        "URLs, for their /metrics: replica_metrics.jsonl); default: those of `make serve "
        "REPLICAS=n` on PORT, none for one server")
    router_policy: tuple[str, ...] = Field(
        default=(), description="run the whole run once per vLLM router policy "
        "(comma-separated, e.g. round_robin,consistent_hash), each through a router the bench "
        "starts in front of the replicas (REPLICA_URLS, or those of `make serve REPLICAS=n`), "
        "so each arm's paired change is measured under each policy; empty: BASE_URL as it is")
    router_metrics_url: str | None = Field(
        default=None, description="the router's own Prometheus endpoint (its per-replica "
        "request counts); default: that of `make serve REPLICAS=n` on PORT")
    source: str | None = Field(
        default=None, description="where each arm's continuation comes from: agent (a live "
        "agent acts from the fork with real tools) or replay (recorded reasoning-model turns "
        "re-sent at their recorded lengths), the sources of bench/run/sources.py; default "
        "replay on CPU profiles, agent on GPU", pattern=r"^[a-z][a-z0-9_-]*$")
    records: tuple[str, ...] = Field(
        default=(), description="replay: the recorded continuations, one per block in turn "
        "(folder names under data/histories/study, folders or globs, comma-separated); default: "
        "the short first-run subset (bench/run/replay.py DEFAULT_RECORDS), 'all': every one")
    side_by_side: bool | None = Field(
        default=None, description="run a block's arms at the same time (the study's design) "
        "or one after another in the block's random order, each alone beside the regime's "
        "background; default side by side for agent, one after another for replay: arms "
        "sharing the engine's batches share each other's prefill, which hides a shorter "
        "history's saving (a history-only arm finishes with clean when their outputs are "
        "equally long)")
    tool_time: Literal["recorded", "0"] = Field(
        default="recorded", description="replay: wait the recorded tool time between turns "
        "(none recorded counts as 0 s) or none")
    task: str = Field(default="fix-median", description="agent: the task whose arm histories "
                      "the live agents continue (data/histories/<task>/)")
    arms: tuple[str, ...] = Field(
        default=(), description="the arms, comma-separated; clean is required; default "
        "clean,external,external-history for replay, clean,external,self for agent")
    seed: int = Field(default=0, ge=0, description="the run seed: block order and sampling")
    seeds: Literal["common", "independent"] = Field(
        default="common", description="common: the arms of one block share a sampling seed "
        "(common random numbers; blocks still differ; the placebo always has its own, so it "
        "is an A/A); independent: every arm its own")
    cache: Literal["shared", "isolated", "block", "run"] | None = Field(
        default=None, description="shared: the arms of a block share the server's prefix "
        "cache; isolated: a fresh cache_salt per arm and attempt; block: one cache_salt per "
        "block, so its arms share a cache that starts cold and nothing carries over from an "
        "earlier block replaying the same record; run: one cache_salt for the whole run, so its "
        "arms and blocks share a cache that starts cold (nothing from earlier runs or other "
        "users of the server), which cache-break accounting can predict exactly; default isolated "
        "for replay (no arm warms another's prefix: the compacted history of external and "
        "external-history is the same text), shared for agent")
    protocol: Literal["strict", "lenient"] | None = Field(
        default=None, description="strict: the first protocol (format) error fails the arm, as "
        "the study did; lenient: mini-swe-agent's terminal statuses count; default strict on GPU "
        "profiles, lenient on CPU")
    rewrite_cache: Literal["fresh", "reuse"] = Field(
        default="fresh", description="fresh: every continuation pays its own rewriting; reuse: "
        "the task's persistent rewrite cache (hits recorded as hits)")
    run_id: str | None = Field(default=None, description="name the run folder (default: "
                               "regime and UTC time)")
    resume: str | None = Field(default=None, description="continue this run id with its own "
                               "settings (a setting given again must match)")
    recover: bool = Field(default=False, description="re-run failed arms later as recovery "
                          "runs (sensitivity analysis only)")
    quiet_only: bool = Field(
        default=False, description="restrict the paired analysis to blocks whose host was "
        "quiet (bench/analysis/host.py: other processes used under a quarter of a core while "
        "the arms ran); the report shows the analysis over every block beside it where the "
        "two differ. A sweep's RESUME with it measures its contended cells again")
    locust_workers: int = Field(default=0, ge=0, description="locust worker processes for the "
                                "background load (0: one local process)")
    background_max_tokens: int | None = Field(
        default=None, gt=0, description="cap each background request's output at this many "
        "tokens (default: each turn's recorded length); on a small CPU server the background "
        "then queues the arms as before, in shorter turns")
    locust_remote_workers: int = Field(
        default=0, ge=0, description="locust workers on other hosts the background load waits "
        "for (up to 10 minutes), each started by hand with the command the bench prints; their "
        "records stay on their hosts until `compaction-bench load merge` (docs/load.md)")
    locust_master: str | None = Field(
        default=None, validate_default=True, description="HOST:PORT the master listens on for "
        "remote workers, e.g. 0.0.0.0:5557 (every interface) or this host's LAN address; "
        "needed with LOCUST_REMOTE_WORKERS")
    step_limit: int | None = Field(default=None, gt=0, description="postfork model calls per "
                                   "arm (default: the task's)")
    results_dir: str = Field(default_factory=lambda: str(results_dir()),
                             description="where run folders go (default: results/)")
    external_url: str | None = Field(
        default=None, description="the external compressor's URL; default on CPU: the "
        "embedded Gemma server (cpu-gemma-compressor) on port + 1, started when needed")
    prompt: str = Field(default="telegraphic", description="the frozen rewrite prompt")
    fast_start: bool = Field(
        default=False, description="start the profile's server with "
        "--optimization-level 0 (no torch.compile): a cold start of seconds instead of minutes, "
        "but steps 18-28% slower on cpu-tiny, so the run is marked and compares only with runs "
        "made the same way; no effect on a server already running")
    selfcheck: bool = Field(default=True, description="run the serve-time self-check before "
                            "the first block (0 skips it; the manifest says so)")
    speculative: bool | None = Field(default=None, description="the profile's opt-in "
                                     "speculative decoding (unset: as the profile has it)")
    expert_parallel: bool | None = Field(default=None, description="the profile's opt-in "
                                         "expert parallelism (unset: as the profile has it)")
    kv_offload: bool | None = Field(default=None, description="the profile's opt-in KV-cache "
                                    "offload to CPU memory (vLLM's OffloadingConnector; unset: "
                                    "as the profile has it)")
    token_ids: bool = Field(default=True, description="ask for every arm request's token ids "
                            "(vLLM's return_token_ids) for cache-break accounting; 0 for a "
                            "server that refuses the field")
    stream_deadline_s: float = Field(
        default=600.0, gt=0, description="the longest silence tolerated on a "
        "target stream (a queued request's wait for its first token included); a stream silent "
        "longer is cut and the arm fails with that reason")
    compressor_deadline_s: float = Field(
        default=300.0, gt=0, description="the same for compressor streams")
    arm_wall_s: float = Field(
        default=3600.0, gt=0, description="the longest postfork part of one arm; "
        "past it the arm ends as TimeExceeded (a censored duration)")
    stall_s: float = Field(
        default=120.0, gt=0, description="the watchdog stops the run when requests are "
        "in flight, the server still answers /health, and no stream has produced a token for "
        "this long (a server that answers but no longer streams)")
    sweep: SweepSettings = Field(default_factory=SweepSettings,
                                 description="REGIME=sweep (and search): levels and their "
                                 "length")
    slo: str = Field(default="p90:2x", description="REGIME=search: the latency target on an "
                     "agent's wall time (postfork plus inline rewriting), as make plan's SLO: "
                     "p90:120s, or p90:2x (twice clean's p90 at N=1)")
    search: SearchSettings = Field(default_factory=SearchSettings,
                                   description="REGIME=search only: its limit and boundary")

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: str) -> str:
        parse_slo(value)
        return value

    @field_validator("locust_master")
    @classmethod
    def _master(cls, value: str | None, info: ValidationInfo) -> str | None:
        remote = info.data.get("locust_remote_workers") or 0
        if value is None:
            if remote:
                raise ValueError(
                    f"LOCUST_REMOTE_WORKERS={remote} needs LOCUST_MASTER=HOST:PORT, the address "
                    "the master listens on for workers on other hosts, e.g. "
                    "LOCUST_MASTER=0.0.0.0:5557")
            return None
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"LOCUST_MASTER={value}: give HOST:PORT with a port from 1 to "
                             "65535, e.g. LOCUST_MASTER=0.0.0.0:5557")
        return value

    @field_validator("repeat")
    @classmethod
    def _repeat(cls, value: int, info: ValidationInfo) -> int:
        regime = info.data.get("regime")
        if value > 1 and regime in (SWEEP, SEARCH):
            raise ValueError(f"REPEAT={value} repeats blocks; REGIME={regime} runs fleets, not "
                             "blocks: run the sweep again as its own run, or drop REPEAT")
        return value

    @field_validator("base_url", "external_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else server_url(value)

    @field_validator("replica_urls")
    @classmethod
    def _replicas(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(server_url(u) for u in value)

    @field_validator("router_policy")
    @classmethod
    def _policies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from compaction_bench.serve.router import offered_policies

        if len(set(value)) != len(value):
            raise ValueError(f"router policies repeat: {', '.join(value)}")
        return offered_policies(value, "ROUTER_POLICY")

    @field_validator("arms")
    @classmethod
    def _arms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            return value  # the source's default arms (`for_profile`)
        if len(set(value)) != len(value):
            raise ValueError(f"arms repeat: {', '.join(value)}")
        if REFERENCE not in value:
            raise ValueError("the arms must include clean, the reference every change is paired "
                             f"against (got {', '.join(value)}); e.g. arms=clean,{value[0]}")
        from compaction_bench.histories.policies.registry import UnknownArmError, parse_arm

        for name in value:
            try:
                parse_arm(name)
            except UnknownArmError as exc:
                raise ValueError(str(exc)) from None
        return value

    def resumed(self, previous: dict[str, object]) -> BenchConfig:
        """This config with every run-defining setting the user did not give taken from the run
        being resumed (its manifest's config), so `RESUME=<id>` alone continues the run as it
        was; a setting given again is kept, and the fingerprint check refuses a change."""
        taken = {k: previous[k] for k in RUN_SETTINGS
                 if k not in self.model_fields_set and k in previous}
        data = {**self.model_dump(exclude_unset=True), **taken}
        return BenchConfig.model_validate(data)

    def position(self, block: int) -> int:
        """Block `block`'s position in its run under REPEAT (blocks interleave run by run): its
        seeds and replay record are those of that block of a run without REPEAT."""
        return (block - 1) // self.repeat + 1

    def repeat_of(self, block: int) -> int:
        """Which of the REPEAT runs block `block` belongs to (1..repeat)."""
        return (block - 1) % self.repeat + 1

    def protocol_for(self, profile: Profile) -> Literal["strict", "lenient"]:
        if self.protocol is not None:
            return self.protocol
        return "strict" if profile.engine == "cuda" else "lenient"


def regime_users(regime: Regime, profile: Profile) -> int:
    """Background users for a regime, from the profile: none, below, above max_num_seqs (none
    for the sweep and the search: their fleets are the load)."""
    if regime in ("dedicated", SWEEP, SEARCH):
        return 0
    if regime == "shared":
        return profile.regimes.shared_users
    return profile.overloaded_users


def continuation_block(level: int, agent: int, index: int) -> int:
    """The block number of continuation `index` of `agent` at `level` (unique in a run; the
    same for every arm, so arms share sampling seeds per (level, agent, index))."""
    if not (0 <= agent < 10_000 and 0 <= index < 9_999):
        raise ValueError(f"agent {agent} / continuation {index} out of range for a block number")
    return (level * 10_000 + agent) * 10_000 + index + 1


def continuation_of(block: int) -> tuple[int, int, int]:
    """(level, agent, index) of a sweep continuation's block number (`continuation_block`)."""
    rest, index = divmod(block - 1, 10_000)
    level, agent = divmod(rest, 10_000)
    return level, agent, index


def derived_seed(run_seed: int, *labels: str | int) -> int:
    """A seed derived from the run seed and labels (block, arm, attempt): different blocks and
    attempts get independent seeds, the same labels always the same one."""
    words = [run_seed, *(lab if isinstance(lab, int) else zlib.crc32(lab.encode())
                         for lab in labels)]
    return int(np.random.SeedSequence(words).generate_state(1)[0] % (2**31 - 1))


def arm_seed(config: BenchConfig, block: int, arm: str, attempt: str) -> int:
    """The base sampling seed of one arm's attempt in a block (see `BenchConfig.seeds`).

    The placebo always has its own stream: with clean's seed it would send clean's bytes and
    sample clean's continuation, a replay measuring timing jitter, not the noise an arm's
    change must beat (issue 22)."""
    if config.seeds == "common" and arm != PLACEBO:
        return derived_seed(config.seed, block, attempt)
    return derived_seed(config.seed, block, attempt, arm)


def cache_salt(config: BenchConfig, run_salt: str, block: int, block_pass: int, arm: str,
               attempt: str) -> str | None:
    """The cache_salt of one arm's attempt (see `BenchConfig.cache`); None: the server's shared
    cache.

    The placebo gets a cache of its own beside clean's, of the same extent: its own per attempt
    (isolated), per block (block), per run (run and shared; clean's shared cache is the
    server's, warm from earlier blocks, and the placebo's is warm from its own). Sharing clean's
    would serve it clean's prefix, so the placebo would not pay what clean pays."""
    isolated = f"{run_salt}-b{block}-p{block_pass}-{arm}-{attempt}"
    if config.cache == "isolated":
        return isolated
    if config.cache == "block":
        return f"{run_salt}-b{block}-p{block_pass}" + (f"-{arm}" if arm == PLACEBO else "")
    if config.cache == "run" or arm == PLACEBO:
        return run_salt + (f"-{arm}" if arm == PLACEBO else "")
    return None
