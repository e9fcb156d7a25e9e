"""Fuzzing the manifest a resumed run reads (`RESUME=<run-id>`): 0 tracebacks. Whatever
manifest.json holds, `open_run` resumes it or refuses with a `SuiteError` naming the file (and
the field); it never fails later, mid-run, on a field it did not check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import event, example, given
from hypothesis import strategies as st

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.resume import open_run
from compaction_bench.common.errors import SuiteError

PRINTS: dict[str, Any] = {"regime": "dedicated", "task": "fix-median"}  # what makes the run
GOOD: dict[str, Any] = {"run_id": "r", "config": {"regime": "dedicated"},
                        "regime": {"name": "dedicated", "blocks": 2},
                        "clock_origin_monotonic": 12.5, "fingerprint": PRINTS}
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
                      | st.just("dedicated"),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                          st.sampled_from(["regime", "blocks", "config", "name", "x"]), inner,
                          max_size=3), max_leaves=8)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(st.binary(max_size=60))
    value = json.loads(json.dumps(GOOD))
    section = draw(st.sampled_from(["config", "regime", "clock_origin_monotonic", "run_id",
                                    "fingerprint"]))
    if choice == 1:
        value[section] = draw(VALUES)
    elif isinstance(value[section], dict):
        key = draw(st.sampled_from(sorted(value[section])))
        value[section][key] = draw(VALUES)
    else:
        del value[section]
    return json.dumps(value).encode()


@given(manifests())
@example(json.dumps(GOOD).encode())
@example(b"\xff\xfe")
@example(b"[" * 100_000)
@example(json.dumps({**GOOD, "config": {"regime": 1}}).encode())
@example(json.dumps({**GOOD, "regime": {"blocks": "2"}}).encode())
@example(json.dumps({**GOOD, "clock_origin_monotonic": float("nan")}).encode())
def test_resuming_any_manifest_resumes_or_refuses_naming_the_file(tmp_path: Path,
                                                                  raw: bytes) -> None:
    run = tmp_path / "r"
    run.mkdir(exist_ok=True)
    (run / "manifest.json").write_bytes(raw)
    config = BenchConfig(regime="dedicated", resume="r", results_dir=str(tmp_path))
    try:
        run_id, folder, manifest = open_run(config, PRINTS)
    except SuiteError as exc:
        assert str(run / "manifest.json") in str(exc) or "not the same run" in str(exc), exc
        event("refused")
        return
    event("resumed")
    assert (run_id, folder) == ("r", run) and manifest is not None
    assert int(manifest["regime"]["blocks"]) >= 0  # what run() reads next does not raise
    assert float(manifest["clock_origin_monotonic"]) == manifest["clock_origin_monotonic"]
