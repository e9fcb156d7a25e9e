"""Arms ready to run in a block: the history each arm continues from, a fresh history policy
per continuation, and the reasoning-only invariant, checked before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from common.errors import SuiteError
from histories.agent.continuation import check_reasoning_only
from histories.compaction.compactor import CompressorConfig
from histories.format.history import History
from histories.format.invariant import InvariantError
from histories.policies.base import CleanPolicy, HistoryPolicy
from histories.policies.compacting import policy_for


class ArmError(SuiteError):
    """An arm cannot be set up (no compressor for it, no clean history to check against)."""


@dataclass(frozen=True)
class Arm:
    """What an arm continues from and how it treats its history on the way."""

    name: str
    history: History
    new_policy: Callable[[], HistoryPolicy]  # a fresh policy (and its state) per continuation
    invariant_error: str | None = None  # the reasoning-only invariant, checked before the run


def arm_for(name: str, history: History, clean: History | None, *,
            compressors: Mapping[str, CompressorConfig], history_path: Path,
            ledger_path: Path) -> Arm:
    """`clean` sends its history unchanged; a compaction arm continues its own arm file and
    compacts each new reasoning block before every request (cache shared with acquisition in
    the task's `compaction/` folder, ledger in the run folder)."""
    if name == "clean":
        return Arm(name=name, history=history, new_policy=CleanPolicy)
    if name not in compressors:
        raise ArmError(f"arm '{name}' has no compressor configured; known: "
                       f"{', '.join(sorted(compressors)) or 'none'}")
    if clean is None:
        raise ArmError(f"arm '{name}' needs the clean arm to check the reasoning-only invariant")
    invariant = None
    try:
        check_reasoning_only(clean, history)
    except InvariantError as exc:
        invariant = f"InvariantError: {exc}"
    factory: Callable[[], HistoryPolicy] = partial(
        policy_for, history, compressors[name], name=name, history_path=history_path,
        ledger_path=ledger_path)
    return Arm(name=name, history=history, new_policy=factory, invariant_error=invariant)
