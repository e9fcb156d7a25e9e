"""Import the source study's B300 per-block records as a run folder, so our analysis reproduces
the study's own figures (paper Appendix E.2, Table 12).

The study names its arms `normal` (our `clean`), `luna` (its external compressor, our
`external`) and `self`. Its time field `complete_task_seconds` is the postfork marginal time:
model requests, orchestration, tools, patch capture and local validation, without rewriting or
setup. The four selections map onto our record model as follows:

- `original_10`: five dedicated and five shared three-arm blocks, all complete.
- `overload_original_25`: 25 overloaded blocks with their failed arms kept as failed originals.
- `overload_retries`: two later single-arm reruns, imported as `recovery` attempts, so they
  enter only the sensitivity analysis (the study's 25-row retry-augmented figures).

The study pooled only its ten original blocks (the overload stress test is a separate
experiment), so the manifest sets `pooled_regimes` to dedicated and shared.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from compaction_bench.bench.runfolder import (
    ARMS_FILE,
    BLOCKS_FILE,
    MANIFEST_FILE,
    AnalysisError,
    ArmRecord,
    BlockRecord,
    write_json,
    write_records,
)
from compaction_bench.common.paths import results_dir, study_root

RUN_ID = "study-b300"


def default_source() -> Path:
    """The study's B300 block records as shipped (`data/study/b300_blocks.json`)."""
    return study_root() / "b300_blocks.json"


def default_out() -> Path:
    return results_dir() / RUN_ID
ARM_NAMES = {"normal": "clean", "luna": "external", "self": "self"}


class StudySourceError(AnalysisError):
    """The study's record file is missing or not in the expected shape."""


def _arm_record(regime: str, block: int, name: str, raw: Any, attempt: str) -> ArmRecord:
    if name not in ARM_NAMES:
        raise StudySourceError(f"unknown study arm {name!r} in {regime} block {block}")
    if not isinstance(raw, dict) or not isinstance(raw.get("complete_task_seconds"), int | float):
        raise StudySourceError(
            f"{regime} block {block} arm {name}: no numeric 'complete_task_seconds'"
        )
    status = raw.get("status")
    complete = status == "complete"
    return ArmRecord(
        regime=regime,
        block=block,
        arm=ARM_NAMES[name],
        attempt=attempt,
        status="complete" if complete else "failed",
        postfork_s=float(raw["complete_task_seconds"]),
        error=raw.get("error"),
        # The study excludes rewriting and did not record its duration per block.
        rewrite_s=None,
        turns=raw.get("turns"),
        terminal_status=str(status),
        reasoning_tokens=raw.get("future_reasoning_tokens"),
        completion_tokens=raw.get("total_output_tokens"),
        history_tokens=None,
        # `evaluation.resolved` is the hidden official evaluation, not the local validation
        # command our `validation` field means, so it is not carried over.
        validation=None,
        protocol_ok=complete,
    )


def convert(data: Any) -> tuple[list[ArmRecord], list[BlockRecord], dict[str, Any]]:
    """Turn the study's `b300_latency` object into arm records, block records and manifest."""
    try:
        latency = data["b300_latency"]
        block_lists = [latency["original_10"], latency["overload_original_25"]]
        retries = latency["overload_retries"]
    except (KeyError, TypeError) as exc:
        raise StudySourceError(
            f"study file lacks {exc}; expected b300_latency.original_10, "
            "overload_original_25 and overload_retries"
        ) from exc
    arms: list[ArmRecord] = []
    blocks: list[BlockRecord] = []
    parents: dict[str, tuple[str, int]] = {}
    for entry in (b for group in block_lists for b in group):
        regime, number = str(entry["regime"]), int(entry["block"])
        parents[str(entry.get("source_sha256"))] = (regime, number)
        # The study did not record the randomized start order or block times.
        blocks.append(BlockRecord(regime=regime, block=number))
        for name in sorted(entry["arms"], key=lambda n: list(ARM_NAMES).index(n)):
            arms.append(_arm_record(regime, number, name, entry["arms"][name], "original"))
    for retry in retries:
        parent = parents.get(str(retry.get("parent_source_sha256")))
        if parent is None:
            raise StudySourceError(
                f"retry of arm {retry.get('arm')} block {retry.get('block')} names a parent "
                "block hash that no original block has"
            )
        arms.append(_arm_record(parent[0], parent[1], retry["arm"], retry["record"], "recovery"))
    manifest = {
        "run_id": RUN_ID,
        "task": latency.get("task_id"),
        "arms": list(ARM_NAMES.values()),
        "arm_names_in_study": ARM_NAMES,
        "pooled_regimes": ["dedicated", "shared"],
        "profile": "study: DeepSeek V4 Flash NVFP4, one B300, TP1, vLLM 0.25.0",
        "notes": (
            "imported from the study's B300 records (paper Appendix E.2); the ten original "
            "blocks (5 dedicated, 5 shared) are pooled as in the study; the overloaded stress "
            "test (64 users, at most 32 active sequences) stands alone; the two retries enter "
            "only the sensitivity analysis; rewrite time was not recorded"
        ),
        "time_field": "complete_task_seconds (postfork marginal time, rewriting excluded)",
        "selection_counts": latency.get("selection_counts"),
    }
    return arms, blocks, manifest


def import_study(source: Path | None = None, out: Path | None = None) -> Path:
    """Write the study's records as a run folder at `out`; return the folder."""
    source = source or default_source()
    out = out or default_out()
    if not source.is_file():
        raise StudySourceError(
            f"{source}: study file not found; the project ships it as data/study/"
            "b300_blocks.json (restore it with `git checkout data/study`), or pass --source PATH"
        )
    raw = source.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StudySourceError(
            f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}); restore the shipped copy "
            "with `git checkout data/study`"
        ) from exc
    arms, blocks, manifest = convert(data)
    manifest["source"] = {"path": str(source), "sha256": hashlib.sha256(raw).hexdigest()}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MANIFEST_FILE, manifest)
    write_records(out / ARMS_FILE, arms)
    write_records(out / BLOCKS_FILE, blocks)
    return out
