"""Typed configuration of the background load (no locust import here: the bench loads it).

`BackgroundConfig` travels to the locust processes as a JSON file; everything they need is in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ReplayOptions(BaseModel):
    """How a recorded history becomes wire requests (see `loadgen/replay.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Native `reasoning` fields: drop them (default: most targets reject or ignore a foreign
    # reasoning field), keep them (targets that accept reasoning on input), or inline them into
    # the content as <think>...</think> so their tokens count on a target without the field.
    reasoning: Literal["drop", "keep", "inline"] = "drop"
    # Tool calls and tool results as recorded, or as plain text (targets without tool support).
    tool_calls: Literal["keep", "inline"] = "keep"
    send_tools: bool = False  # send the history's tool schemas (needs tool-choice support)
    # estimate for capping and missing lengths; headroom for the chat template
    chars_per_token: float = Field(default=3.5, gt=0)
    prompt_margin_tokens: int = Field(default=256, ge=0)
    default_max_tokens: int = Field(default=256, gt=0)
    default_tool_gap_s: float = Field(default=2.0, ge=0)
    default_request_s: float = Field(default=10.0, ge=0)
    # Planned request duration: None = the recorded wall time of the turn (fallback
    # default_request_s); a number = completion tokens / this rate (a server-speed guess).
    pace_tokens_per_s: float | None = Field(default=None, gt=0)
    extra_body: dict[str, object] = Field(default_factory=dict)  # e.g. {"cache_salt": "bg"}


def _default_histories() -> list[Path]:
    from loadgen.replay import default_history_paths

    return default_history_paths(Path(__file__).resolve().parent.parent / "histories")


class BackgroundConfig(BaseModel):
    """One background load: `users` replaying `histories` against `base_url` until stopped.

    Paths may be relative (resolved when the load starts). Unset: `histories` = the shipped
    study histories plus any `histories/<task>/clean.json`; `state_dir` = `<out's folder>/
    background`; `block_file` = `<state_dir>/block`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str  # the server, with or without the /v1 suffix
    model: str = "target"
    users: int = Field(gt=0)
    regime: str = "shared"
    out: Path  # requests.jsonl to append to
    origin: float = 0.0  # time.monotonic() value the records count from (the run's start)
    spawn_rate: float = Field(default=1.0, gt=0)  # planned starts per second: user i at i/rate
    duration_s: float = Field(default=7200.0, gt=0)  # hard bound: the load stops itself then
    workers: int = Field(default=0, ge=0)  # 0: one local locust process; N: master+N workers
    max_model_len: int = Field(default=8192, gt=0)  # prompts are capped to fit (replay.py)
    histories: list[Path] = Field(default_factory=_default_histories)
    state_dir: Path | None = None
    block_file: Path | None = None
    seed: int = 0
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=3600.0, gt=0)
    replay: ReplayOptions = ReplayOptions()

    @property
    def api_url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        url = self.base_url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

    def resolved(self) -> BackgroundConfig:
        """Absolute paths and the defaults filled in (what the locust processes receive)."""
        state = (self.state_dir or self.out.parent / "background").resolve()
        return self.model_copy(update={
            "out": self.out.resolve(), "state_dir": state,
            "histories": [h.resolve() for h in self.histories],
            "block_file": (self.block_file or state / "block").resolve()})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BackgroundConfig:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
