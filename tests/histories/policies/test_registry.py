"""Arm names are parsed in one place; an unknown one fails with one line naming the known."""

from __future__ import annotations

import pytest

from compaction_bench.histories.policies.registry import (
    ArmSpec,
    UnknownArmError,
    compressors_needed,
    parse_arm,
)


def test_every_arm_name_the_suite_knows() -> None:
    assert parse_arm("clean") == ArmSpec("clean", "reference")
    assert parse_arm("placebo").kind == "reference"
    assert parse_arm("self") == ArmSpec("self", "compaction", compressor="self")
    assert parse_arm("self-every-3") == ArmSpec("self-every-3", "compaction", compressor="self",
                                                every=3)
    assert parse_arm("external-every-10").compressor == "external"
    assert parse_arm("random-30") == ArmSpec("random-30", "random", percent=30)
    for name in ("entropy", "step-entropy", "delete-all-thinking", "keep-latest"):
        spec = parse_arm(name)
        assert spec.kind == name and spec.stepwise
    assert parse_arm("entropy").needs_scorer and not parse_arm("random-30").needs_scorer
    assert compressors_needed(["clean", "entropy", "external-every-2", "self"]) == {
        "external", "self"}
    # in-context compaction and the agent's own recorded one: neither needs a compressor server
    assert parse_arm("self-inline") == ArmSpec("self-inline", "inline")
    assert parse_arm("recorded") == ArmSpec("recorded", "recorded")
    assert not parse_arm("self-inline").stepwise and not parse_arm("recorded").stepwise
    assert compressors_needed(["clean", "self-inline", "recorded"]) == set()


@pytest.mark.parametrize("name", ["entropi", "random-0", "random-101", "random-x", "self-every-1",
                                  "gemma-every-3", "Entropy"])
def test_unknown_or_out_of_range_names_fail_in_one_line(name: str) -> None:
    with pytest.raises(UnknownArmError) as caught:
        parse_arm(name)
    message = str(caught.value)
    assert "\n" not in message and repr(name) in message
    if name in ("entropi", "random-x", "gemma-every-3", "Entropy"):
        assert ("known arms: clean, placebo, external, self, self-inline (in-context, live), "
                "recorded (the agent's own compaction, replay), external-history (replay), "
                "entropy" in message)
