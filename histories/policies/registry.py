"""Arm names, parsed in one place: a name in `ARMS=` says which history policy an arm runs.

- `clean` (the reference) and `placebo` (clean's file under another name): unchanged history;
- `external-history` (replay only): the external arm's compacted history continued with clean's
  recorded turns and lengths, the part of the external arm's effect due to its history;
- `external`, `self`: the study's continuous compaction by that compressor, before every request;
- `<compressor>-every-<n>` (`self-every-3`): the same compaction run only every n turns;
- `recorded` (replay only): the agent's own compaction as its log recorded it (a log imported
  with its compaction: `histories/format/importers/compaction.py`), against `clean`, the same
  log with the compaction undone; both continue with the log's turns after it;
- `self-inline`: in-context self-compaction, as agent harnesses do it: the target model asked,
  in the agent's own context, to summarize the history before the fork, whose summary then
  replaces it (`histories.policies.inline`); live agents only;
- `entropy` (ICLR), `step-entropy` (its step-only control), `delete-all-thinking`,
  `keep-latest`, `random-<r>` (`random-30`: r% of each step's reasoning tokens removed): the
  second paper's policies (`histories.policies.rules`), one `StepwisePolicy` each.

An unknown name fails with one line listing the known ones. Parsing imports nothing heavy, so
the bench's config can check names before anything starts; the scorer loads only when a policy
that needs it is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.ledger import Ledger
from compaction_bench.histories.format.importers.compaction import RECORDED_ARM as RECORDED_ARM

if TYPE_CHECKING:  # the policies import torch and transformers only where they are built
    from compaction_bench.histories.policies.scorer import ScorerConfig
    from compaction_bench.histories.policies.stepwise import StepwisePolicy

REFERENCE_ARMS = ("clean", "placebo")
HISTORY_ONLY_ARMS = ("external-history",)
INLINE_ARMS = ("self-inline",)
COMPRESSOR_ARMS = ("external", "self")
RULE_ARMS = ("entropy", "step-entropy", "delete-all-thinking", "keep-latest")
# The second paper's arms a `make histories` writes by default (random-r at the paper's 30%).
POLICY_ARMS = (*RULE_ARMS, "random-30")
_RANDOM = re.compile(r"^random-(\d{1,3})$")
_EVERY = re.compile(r"^(" + "|".join(COMPRESSOR_ARMS) + r")-every-(\d{1,4})$")
KNOWN = ("clean, placebo, external, self, self-inline (in-context, live), "
         "recorded (the agent's own compaction, replay), "
         "external-history (replay), entropy, step-entropy, "
         "delete-all-thinking, "
         "keep-latest, random-<r> (r% of reasoning tokens, e.g. random-30), "
         "<external|self>-every-<n> (compaction every n turns, e.g. self-every-3)")

Kind = Literal["reference", "history-only", "compaction", "inline", "recorded", "entropy",
               "step-entropy",
               "delete-all-thinking", "keep-latest", "random"]
_RULE_KINDS: dict[str, Kind] = {"entropy": "entropy", "step-entropy": "step-entropy",
                                "delete-all-thinking": "delete-all-thinking",
                                "keep-latest": "keep-latest"}


class UnknownArmError(SuiteError):
    """An arm name that names no policy; the message lists the known ones."""


@dataclass(frozen=True)
class ArmSpec:
    """What an arm name means."""

    name: str
    kind: Kind
    compressor: str | None = None  # compaction: which compressor
    every: int = 1  # compaction: the cadence in turns
    percent: int | None = None  # random: r

    @property
    def stepwise(self) -> bool:
        """A second-paper policy (a `StepwisePolicy`), not compaction or the reference."""
        return self.kind not in ("reference", "history-only", "compaction", "inline",
                                 "recorded")

    @property
    def needs_scorer(self) -> bool:
        return self.kind in ("entropy", "step-entropy")


def parse_arm(name: str) -> ArmSpec:
    """The spec of an arm name, or `UnknownArmError` listing the known names."""
    if name in REFERENCE_ARMS:
        return ArmSpec(name, "reference")
    if name in HISTORY_ONLY_ARMS:
        return ArmSpec(name, "history-only")
    if name in COMPRESSOR_ARMS:
        return ArmSpec(name, "compaction", compressor=name)
    if name in INLINE_ARMS:
        return ArmSpec(name, "inline")
    if name == RECORDED_ARM:
        return ArmSpec(name, "recorded")
    if name in _RULE_KINDS:
        return ArmSpec(name, _RULE_KINDS[name])
    if match := _RANDOM.match(name):
        percent = int(match.group(1))
        if not 1 <= percent <= 100:
            raise UnknownArmError(f"arm {name!r}: random-<r> removes r% of the reasoning "
                                  "tokens, r from 1 to 100 (e.g. random-30)")
        return ArmSpec(name, "random", percent=percent)
    if match := _EVERY.match(name):
        every = int(match.group(2))
        if every < 2:
            raise UnknownArmError(f"arm {name!r}: compaction every {every} turn is the "
                                  f"{match.group(1)} arm itself; use n >= 2 (e.g. "
                                  f"{match.group(1)}-every-3) or ARMS=...,{match.group(1)}")
        return ArmSpec(name, "compaction", compressor=match.group(1), every=every)
    raise UnknownArmError(f"unknown arm {name!r}; known arms: {KNOWN}")


def arm_kind(name: str) -> Kind | None:
    """The kind of an arm name, or None for a name that is no arm of the suite's (a test's
    hand-made arm, an older run's name)."""
    try:
        return parse_arm(name).kind
    except UnknownArmError:
        return None


def compressors_needed(names: tuple[str, ...] | list[str]) -> set[str]:
    """The compressors (`external`, `self`) some arm of `names` compacts with."""
    return {spec.compressor for spec in map(parse_arm, names) if spec.compressor}


def stepwise_policy(spec: ArmSpec, *, reasoning_mode: str, protocol: str,
                    scorer: ScorerConfig, seed: int, settled: tuple[int, ...] | list[int] = (),
                    ledger: Ledger | None = None, context: dict[str, Any] | None = None,
                    origin_s: float = 0.0, clock: Clock = monotonic) -> StepwisePolicy:
    """The `StepwisePolicy` of a second-paper arm. `scorer` is the arm's `ScorerConfig` (its
    model also tokenizes for the ledger's token counts and for random-r); `seed` seeds random-r.
    Loads the scorer (entropy arms) or the tokenizer now, not on the first request."""
    from compaction_bench.histories.policies.rules import DeleteRule, EntropyRule, RandomRule
    from compaction_bench.histories.policies.scorer import ProxyScorer, ProxyTokenizer
    from compaction_bench.histories.policies.stepwise import StepwisePolicy

    tokenizer = ProxyTokenizer.shared(scorer.model)
    rule: Any
    if spec.kind in ("entropy", "step-entropy"):
        rule = EntropyRule(ProxyScorer.shared(scorer), conditioned=spec.kind == "entropy")
    elif spec.kind == "random":
        assert spec.percent is not None
        rule = RandomRule(spec.percent, tokenizer, seed=seed)
    elif spec.kind in ("delete-all-thinking", "keep-latest"):
        rule = DeleteRule(spec.kind)
    else:
        raise ValueError(f"arm {spec.name} is not a second-paper policy ({spec.kind})")
    return StepwisePolicy(rule, name=spec.name, reasoning_mode=reasoning_mode,
                          protocol=protocol, settled=settled,
                          defer_latest=spec.kind == "keep-latest", ledger=ledger,
                          tokenizer=tokenizer, context=context, clock=clock, origin_s=origin_s)
