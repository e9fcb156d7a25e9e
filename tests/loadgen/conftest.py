"""Fixtures of the load-generation tests: one fake OpenAI server (known delays) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProcess]:
    """The fake server in its own process: 200 ms to the first token, 20 ms between tokens."""
    with FakeProcess(FakeConfig(ttft_ms=200, itl_ms=20, tokens=20, cached_tokens=16)) as server:
        yield server
