"""What a history policy other than compaction changed: one `PolicyEdit` per assistant turn it
decided on, appended to the run's (or the task's) rewrite ledger as it happens.

A line says which turn (message index), what the rule did (`outcome`), the reasoning before and
after in words and in tokens of the proxy model's tokenizer, and what deciding cost: scorer
seconds (tokenize, forward pass, entropy; device synchronized), scorer input tokens, the time
spent waiting for another arm's scorer call, and the device. Entropy rules also record every
segment's mean entropy and which segments became [SKIP]; the random rule its seed and how many
tokens it removed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EditOutcome = Literal[
    "pruned",  # entropy: the lowest floor(0.8 N) of N >= 2 segments became [SKIP]
    "single-segment",  # entropy: N = 1, nothing removed (and nothing scored)
    "skipped-scorer-limit",  # entropy: the scorer input exceeded its limit; left as it was
    "deleted",  # delete-all-thinking, keep-latest: the reasoning removed
    "tokens-removed",  # random-r: r% of the reasoning's tokens removed
    "too-short",  # random-r: r% of its tokens rounds down to none
    "empty",  # nothing to edit: the turn has no reasoning
    "failed",  # the rule raised, or its input is past the scorer's context; sent unchanged
]
EDIT_OUTCOMES: tuple[EditOutcome, ...] = (
    "pruned", "single-segment", "skipped-scorer-limit", "deleted", "tokens-removed", "too-short",
    "empty", "failed")


@dataclass(frozen=True)
class PolicyEdit:
    """One decision of a history policy on one assistant turn (module docstring). `at` is
    wall-clock epoch seconds, `t_s` the run's clock (seconds since its start)."""

    at: float
    t_s: float
    policy: str  # the arm name (entropy, random-30, ...)
    rule: str  # entropy | step-entropy | delete-all-thinking | keep-latest | random
    message_index: int
    outcome: EditOutcome
    block_sha256: str  # of the turn's raw editable reasoning
    words_in: int
    words_out: int
    tokens_in: int | None = None  # proxy tokenizer tokens (None: no tokenizer)
    tokens_out: int | None = None
    segments: int | None = None
    removed_segments: list[int] = field(default_factory=list)
    segment_entropy: list[float | None] = field(default_factory=list)
    removed_tokens: int | None = None
    seed: int | None = None
    scorer_s: float = 0.0
    scorer_tokens: int = 0
    queued_s: float = 0.0
    device: str | None = None
    tokenizer: str | None = None
    error: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    kind: str = "policy"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
