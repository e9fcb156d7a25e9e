"""The wire options: how a recorded history becomes requests on the wire (which fields are
kept, dropped or inlined, what is sent beside the messages) and how its turns are paced. Read by
loadgen/schedule.py, which turns a history into planned requests, and by every replay (the
background load, a replayed arm, the client benchmark)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ReplayOptions(BaseModel):
    """How a recorded history becomes wire requests (see `loadgen/schedule.py`)."""

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
    # every turn's output at most this many tokens (None: as recorded); its source reads "cap"
    max_completion_tokens: int | None = Field(default=None, gt=0)
    default_tool_gap_s: float = Field(default=2.0, ge=0)
    default_request_s: float = Field(default=10.0, ge=0)
    # Planned request duration, in this order: a fixed pace (completion tokens / this rate, for
    # tests and the client benchmark); the turn's recorded wall time; the server's measured
    # service time (measured_ttft_s + tokens / measured_tokens_per_s, from `measure_service`);
    # else default_request_s.
    pace_tokens_per_s: float | None = Field(default=None, gt=0)
    measured_ttft_s: float | None = Field(default=None, ge=0)
    measured_tokens_per_s: float | None = Field(default=None, gt=0)
    extra_body: dict[str, object] = Field(default_factory=dict)  # e.g. {"cache_salt": "bg"}
