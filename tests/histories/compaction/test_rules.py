"""The compaction rules' checks: lexical diagnostics on the study's own Table 5 example and the
frozen prompts (no server needed). Redaction has its own file, test_redaction.py."""

from __future__ import annotations

import pytest

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.compaction.lexical import (
    count_words,
    lexical_diagnostics,
    required_fields,
)
from compaction_bench.histories.compaction.prompts import load_prompt, prompt_names

# Table 5 of the study: the raw block and the rewrite, as the paper prints them.
TABLE5_RAW = (
    "Let me check the hard constraints: 1. binding_quote_usd <= 1,000,000 - all options have "
    "estimated_usd below 1M, but these are estimates, not binding quotes. 2. minimum_sites >= 2 "
    "- V1 has 1 site, so V1 violates this constraint. V2 (3), V3 (2), V4 (3), V5 (2) all "
    "satisfy. 3. reliability_gte >= 0.94 - we don't have reliability data yet. 4. risk_lte <= "
    "0.05 - we don't have risk data yet. So the remaining options are V2, V3, V4, V5.")
TABLE5_REWRITE = (
    "Binding quote ≤ $1,000,000 cannot be verified from estimates. Minimum sites ≥ 2 excludes "
    "V1 (1 site); V2 (3), V3 (2), V4 (3), and V5 (2) pass. Reliability ≥ 0.94 and risk ≤ 0.05 "
    "lack data. Simulate the four surviving options.")


def test_lexical_diagnostics_catch_a_dropped_threshold() -> None:
    assert required_fields(TABLE5_RAW) == ["V1", "V2", "V3", "V4", "V5", "1000000", "2", "0.94",
                                           "0.05"]
    assert lexical_diagnostics(TABLE5_RAW, TABLE5_REWRITE).missing_required == []
    dropped = TABLE5_REWRITE.replace(" and risk ≤ 0.05", "")
    got = lexical_diagnostics(TABLE5_RAW, dropped)
    assert got.missing_required == ["0.05"] and "0.05" in got.missing_numbers
    assert "risk_lte" in got.missing_identifiers and not got.clean
    assert count_words(TABLE5_REWRITE) < count_words(TABLE5_RAW)


def test_frozen_prompts_are_the_study_wording() -> None:
    # the study's four, and the suite's own in-context compaction instruction (self-inline)
    assert prompt_names() == ["inline-summary", "judge-a4", "telegraphic",
                              "telegraphic-evidence", "telegraphic-evidence-a3"]
    telegraphic = load_prompt("telegraphic").text
    assert telegraphic.startswith("Rewrite an assistant reasoning scratchpad into a shorter")
    assert "predict the requested tool\u2019s result: that tool has not run yet." in telegraphic
    evidence = load_prompt("telegraphic-evidence").text
    a3 = load_prompt("telegraphic-evidence-a3").text
    sentence = ("Preserve evidence-status distinctions exactly, including estimate versus binding "
                "quote and observed versus pending. ")
    assert sentence in evidence and evidence.replace(sentence, "") == telegraphic
    assert a3.startswith(evidence.split(sentence)[0] + sentence + "The requested tool call and")
    assert a3.endswith(evidence.split(sentence)[1])
    assert "verdict (\u2019pass\u2019 or \u2019fail\u2019)" in load_prompt("judge-a4").text
    with pytest.raises(SuiteError, match="unknown prompt"):
        load_prompt("casual")
