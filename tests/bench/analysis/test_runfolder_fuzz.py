"""Fuzzing run folders: a real synthetic run whose files are torn, deleted, filled with
non-UTF-8 bytes, or given lines and fields of arbitrary JSON. 0 tracebacks: `read_run` never
raises on content, `analyze` never raises on what it read, and `write_report` always writes a
report whose summary.json is strict JSON."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.analysis.summary import build_summary
from compaction_bench.bench.report.document import to_html, to_markdown
from compaction_bench.bench.report.run_report import build_document, write_report
from compaction_bench.bench.runfolder import read_run
from compaction_bench.common.files import strict

FILES = ("manifest.json", "arms.jsonl", "blocks.jsonl", "requests.jsonl", "metrics.jsonl")
FIELDS = ["regime", "block", "arm", "attempt", "status", "postfork_s", "rewrite_s", "source",
          "request_id", "sent_s", "first_token_s", "end_s", "chunk_times_s", "t_s", "order",
          "schema", "arms", "pooled_regimes", "run_id", "reasoning_tokens", "history_tokens"]
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats() | st.sampled_from(
        ["clean", "external", "self", "dedicated", "shared", "original", "recovery",
         "complete", "failed", "ok", ""]) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(FIELDS), inner, max_size=3), max_leaves=8)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory,
             make_run_module: Callable[..., Path]) -> dict[str, bytes]:
    run = make_run_module()
    return {name: (run / name).read_bytes() for name in FILES}


@pytest.fixture(scope="module")
def make_run_module(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from compaction_bench.bench.runfolder import (  # the synthetic writer's records
        ArmRecord,
        BlockRecord,
        MetricSample,
        RequestRecord,
        write_json,
        write_records,
    )

    def make() -> Path:
        run = tmp_path_factory.mktemp("pristine") / "run-f"
        arms, blocks, requests, metrics = [], [], [], []
        for regime in ("dedicated", "shared"):
            for block in (1, 2):
                t = 100.0 * block
                blocks.append(BlockRecord(regime, block, ("self", "clean", "external"), t,
                                          t + 50))
                for arm, ratio in (("clean", 1.0), ("external", 0.8), ("self", 0.7)):
                    arms.append(ArmRecord(regime, block, arm, "original", "complete",
                                          40.0 * ratio + block, rewrite_s=0.0 if arm == "clean"
                                          else 2.0, reasoning_tokens=int(900 * ratio),
                                          history_tokens=5000))
                    requests.append(RequestRecord(
                        regime=regime, source=arm, request_id=f"{regime}-{block}-{arm}",
                        sent_s=t, status="ok", block=block, intended_send_s=t,
                        first_token_s=t + 0.2, end_s=t + 1.0,
                        chunk_times_s=(t + 0.2, t + 0.5, t + 1.0), prompt_tokens=4000,
                        cached_tokens=3000, completion_tokens=3))
                metrics.append(MetricSample(t, 1.0, 0.0, 0.3, 10.0 * block, 20.0 * block))
        write_json(run / "manifest.json", {"run_id": "run-f", "arms": ["clean", "external",
                                                                        "self"]})
        write_records(run / "arms.jsonl", arms)
        write_records(run / "blocks.jsonl", blocks)
        write_records(run / "requests.jsonl", requests)
        write_records(run / "metrics.jsonl", metrics)
        return run

    return make


@st.composite
def damaged(draw: st.DrawFn, files: dict[str, bytes]) -> dict[str, bytes | None]:
    """The run's files with one to four damages (None: the file is deleted)."""
    out: dict[str, bytes | None] = dict(files)
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(FILES))
        data = out[name]
        how = draw(st.sampled_from(["delete", "tear", "bytes", "json-line", "field", "dup",
                                    "garbage-tail", "empty"]))
        if how == "delete" or data is None:
            out[name] = None if how == "delete" else draw(st.binary(max_size=40))
            continue
        lines = data.split(b"\n")
        at = draw(st.integers(0, max(0, len(lines) - 1)))
        if how == "tear":
            out[name] = data[: draw(st.integers(0, len(data)))]
        elif how == "bytes":
            lines[at] = draw(st.binary(max_size=30))
            out[name] = b"\n".join(lines)
        elif how == "json-line":
            lines[at] = json.dumps(draw(VALUES)).encode()
            out[name] = b"\n".join(lines)
        elif how == "field":
            try:
                obj = json.loads(lines[at])
            except ValueError:
                continue
            if isinstance(obj, dict):
                key = draw(st.sampled_from(sorted({*obj, *FIELDS})))
                if draw(st.booleans()):
                    obj.pop(key, None)
                else:
                    obj[key] = draw(VALUES)
                lines[at] = json.dumps(obj).encode()  # NaN and Infinity where floats are
            out[name] = b"\n".join(lines)
        elif how == "dup":
            lines.insert(at, lines[at])
            out[name] = b"\n".join(lines)
        elif how == "garbage-tail":
            out[name] = data + draw(st.binary(min_size=1, max_size=20))
        else:
            out[name] = b""
    return out


def write_folder(root: Path, files: dict[str, bytes | None]) -> Path:
    run = root / "run-f"
    run.mkdir()
    for name, data in files.items():
        if data is not None:
            (run / name).write_bytes(data)
    return run


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"summary.json holds {constant}: not strict JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_block_order_naming_no_arm_is_a_reported_line(pristine: dict[str, bytes],
                                                        tmp_path: Path) -> None:
    """Found by the long run: `"order": [null]` in blocks.jsonl crashed the report's block table."""
    blocks = pristine["blocks.jsonl"].replace(b'"order": ["self", "clean", "external"]',
                                              b'"order": [null]', 1)
    records = read_run(write_folder(tmp_path, {**pristine, "blocks.jsonl": blocks}))
    assert any(i.file == "blocks.jsonl" and i.line == 1 and "'order'" in i.reason
               for i in records.issues), records.issues
    assert to_markdown(build_document(analyze(records), {})).strip()


# analyze() costs about 0.7 s an example (10,000-resample bootstraps and the noise figures): an
# eighth of the default examples here (12, so the unit tier stays within its 2 minutes), 625
# under COMPBENCH_FUZZ=long.
@settings(max_examples=max(10, settings.default.max_examples // 8))
@given(data=st.data())
def test_a_damaged_run_reads_analyses_and_renders_without_a_traceback(
        pristine: dict[str, bytes], data: st.DataObject) -> None:
    """read_run, analyze, the report's document (without its plots) and summary.json."""
    files = data.draw(damaged(pristine))
    with tempfile.TemporaryDirectory() as root:
        records = read_run(write_folder(Path(root), files))
    analysis = analyze(records)
    event(f"complete blocks: {sum(b.complete for b in analysis.blocks)}")
    event("issues reported" if records.issues else "no issues")
    assert all(issue.reason for issue in records.issues)
    document = build_document(analysis, {})
    assert to_markdown(document).strip() and to_html(document).strip()
    text = json.dumps(strict(build_summary(analysis)), allow_nan=False)
    assert isinstance(strict_json(text), dict)


# The whole report, plots included, costs 1-4 s an example here (matplotlib): a few examples.
@settings(max_examples=max(3, settings.default.max_examples // 30))
@given(data=st.data())
@example(data=None)
def test_a_damaged_run_always_gets_a_report_with_strict_json(pristine: dict[str, bytes],
                                                             data: st.DataObject | None) -> None:
    if data is None:  # every file non-UTF-8, the manifest included
        files: dict[str, bytes | None] = {name: b"\xff\xfe\x00" for name in FILES}
    else:
        files = data.draw(damaged(pristine))
    with tempfile.TemporaryDirectory() as root:
        run = write_folder(Path(root), files)
        report = write_report(run)
        assert report.markdown.read_text(encoding="utf-8").strip()
        assert "<html" in report.html.read_text(encoding="utf-8").lower()
        summary = strict_json(report.summary.read_text(encoding="utf-8"))
        assert isinstance(summary, dict)


@pytest.mark.parametrize("manifest", [
    b"\xff\xfe{}", b"[" * 100_000, b'{"arms": 1, "pooled_regimes": "dedicated", "run_id": 5}',
    b'{"arms": [1, null], "pooled_regimes": [2]}', b"NaN", b"",
    b'{"arms": ["external", "self"]}',  # found by the long run: no clean arm was a KeyError
], ids=["non-utf8", "nested", "wrong-types", "wrong-items", "nan", "empty", "no-clean-arm"])
def test_a_bad_manifest_is_an_issue_of_the_run_not_a_traceback(
        pristine: dict[str, bytes], tmp_path: Path, manifest: bytes) -> None:
    run = write_folder(tmp_path, {**pristine, "manifest.json": manifest})
    records = read_run(run)
    analysis = analyze(records)
    assert analysis.blocks
    document = build_document(analysis, {})
    assert to_markdown(document).strip()
    if not manifest.startswith(b"{"):
        assert any(i.file == "manifest.json" for i in records.issues), records.issues
