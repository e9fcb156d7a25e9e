"""Arm plans for a block: the history each arm continues from, a fresh history policy per
continuation, and the reasoning-only invariant, checked before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from bench.block import ArmPlan
from histories.checks import InvariantError, check_reasoning_only
from histories.compaction import CompressorConfig
from histories.continuous import policy_for
from histories.format import History
from histories.policy import CleanPolicy, HistoryPolicy


class PlanError(ValueError):
    """An arm cannot be planned (no compressor for it, no clean history to check against)."""


def plan_for(arm: str, history: History, clean: History | None, *,
             compressors: Mapping[str, CompressorConfig], history_path: Path,
             ledger_path: Path) -> ArmPlan:
    """`clean` sends its history unchanged; a compaction arm continues its own arm file and
    compacts each new reasoning block before every request (cache shared with acquisition in
    the task's `compaction/` folder, ledger in the run folder)."""
    if arm == "clean":
        return ArmPlan(arm=arm, history=history, new_policy=CleanPolicy)
    if arm not in compressors:
        raise PlanError(f"arm '{arm}' has no compressor configured; known: "
                        f"{', '.join(sorted(compressors)) or 'none'}")
    if clean is None:
        raise PlanError(f"arm '{arm}' needs the clean arm to check the reasoning-only invariant")
    invariant = None
    try:
        check_reasoning_only(clean, history)
    except InvariantError as exc:
        invariant = f"InvariantError: {exc}"
    factory: Callable[[], HistoryPolicy] = partial(
        policy_for, history, compressors[arm], name=arm, history_path=history_path,
        ledger_path=ledger_path)
    return ArmPlan(arm=arm, history=history, new_policy=factory, invariant_error=invariant)
