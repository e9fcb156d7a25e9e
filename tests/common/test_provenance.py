"""Provenance facts read from the real checkout and the real environment."""

from __future__ import annotations

import re

import pytest

from compaction_bench.common.provenance import git_commit, host_facts, package_versions


@pytest.mark.e2e
def test_git_commit_of_this_checkout() -> None:
    commit = git_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", commit["commit"] or "")
    assert isinstance(commit["dirty"], bool)


def test_package_versions_say_none_for_what_is_missing() -> None:
    versions = package_versions(["pydantic", "no-such-distribution-here"])
    assert versions["pydantic"] and versions["no-such-distribution-here"] is None


def test_host_facts_name_the_cpu() -> None:
    facts = host_facts()
    assert facts["cpu"] and facts["cpus_usable"] >= 1 and facts["python"].count(".") == 2
    assert facts["load_average"] is None or len(facts["load_average"]) == 3
