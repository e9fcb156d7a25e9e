"""The placebo is a real A/A (issue 22): its own sampling seed and its own cache, so its paired
change is the noise of two independent continuations of one history, not timing jitter."""

from __future__ import annotations

import pytest

from compaction_bench.bench.run.config import PLACEBO, BenchConfig, arm_seed, cache_salt


@pytest.mark.parametrize("seeds", ["common", "independent"])
def test_the_placebo_never_shares_cleans_seed(seeds: str) -> None:
    config = BenchConfig(seeds=seeds, arms=("clean", "external", PLACEBO))
    for block in (1, 2, 3):
        for attempt in ("original", "recovery"):
            clean = arm_seed(config, block, "clean", attempt)
            assert arm_seed(config, block, PLACEBO, attempt) != clean
            # the other arms keep the rule they had: common random numbers under `common`
            assert (arm_seed(config, block, "external", attempt) == clean) == (seeds == "common")
    # its own stream still differs between blocks and repeats for the same labels
    placebo = {arm_seed(config, b, PLACEBO, "original") for b in (1, 2, 3)}
    assert len(placebo) == 3 and arm_seed(config, 2, PLACEBO, "original") in placebo


@pytest.mark.parametrize("cache", ["shared", "isolated", "block", "run"])
def test_the_placebo_has_a_cache_of_its_own(cache: str) -> None:
    config = BenchConfig(cache=cache, arms=("clean", "external", PLACEBO))

    def salt(arm: str, block: int = 1) -> str | None:
        return cache_salt(config, "run-x", block, 1, arm, "original")

    assert salt(PLACEBO) is not None and salt(PLACEBO) != salt("clean")
    # of the same extent as clean's: per block where clean's is per block, else for the run
    assert (salt(PLACEBO, 1) == salt(PLACEBO, 2)) == (cache in ("shared", "run"))
    # the other arms keep theirs: shared has no salt, block and run share one among the arms
    assert (salt("clean") is None) == (cache == "shared")
    assert (salt("external") == salt("clean")) == (cache != "isolated")
