"""Importer for the study's continuation records (`*__rep-*.json`, shipped in data/study/records).

A record holds one model's frozen history of one task in two branches, `clean` (original
reasoning) and `rewritten` (the same history with each reasoning block rewritten by the study's
external frontier compressor), each continued for a few turns. Each branch's first request is
the shared history plus the pending tool result, so:

- messages: that request up to and including its last assistant turn (the fork);
- fork: that assistant turn's tool call, with the tool result as `pending_result`;
- continuation: the pending result, then every recorded turn (assistant message as the next
  request echoed it, with usage, wall time and the study's per-turn check in its `extra`, and the
  tool result that followed it);
- arm: `clean` for the clean branch, `external` for the rewritten one;
- provenance.study: the record's identifiers (task, model route, seeds, source hash, outcome);
  provenance.sampling: the request settings.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from compaction_bench.histories.format.history import (
    History,
    HistoryError,
    parse_json_file,
    refusal,
    save_history,
)
from compaction_bench.histories.format.importers.normalize import build_history, source_record

BRANCH_ARMS = {"clean": "clean", "rewritten": "external"}
SAMPLING_KEYS = ("model", "tool_choice", "reasoning", "include_reasoning", "temperature",
                 "max_tokens", "provider")
# Not in the record itself: the paper (Sections 2 and A.4) states that GPT 5.6 Sol wrote the
# controlled rewrites; configs/rewriters.json calls that route `final_external`.
COMPRESSOR_NOTE = ("external frontier compressor; per the paper GPT 5.6 Sol "
                   "(openai/gpt-5.6-sol, rewriters.json 'final_external'); not named in the record")


def is_study_record(data: Any) -> bool:
    """True for a parsed continuation record of the study."""
    return (isinstance(data, dict) and isinstance(data.get("branches"), dict)
            and "continuation_seed" in data and "clean" in data["branches"])


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant response as the study sent it back as history (its assistant_history_message
    rule: content, reasoning only when non-empty, tool_calls when present)."""
    echoed: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning"):
        echoed["reasoning"] = message["reasoning"]
    if message.get("tool_calls") is not None:
        echoed["tool_calls"] = copy.deepcopy(message["tool_calls"])
    return echoed


def _object(value: Any) -> dict[str, Any]:
    """`value` where it is a JSON object, else {}: a malformed part reads as absent, and the
    fields that must be there are refused by name where they are checked."""
    return value if isinstance(value, dict) else {}


def _first_choice(turn: dict[str, Any]) -> dict[str, Any]:
    choices = _object(turn.get("response")).get("choices")
    return _object(choices[0]) if isinstance(choices, list) and choices else {}


def _turn_extra(turn: dict[str, Any]) -> dict[str, Any]:
    response = _object(turn.get("response"))
    choice = _first_choice(turn)
    extra = {"usage": response.get("usage"), "wall_seconds": turn.get("wall_seconds"),
             "metrics": turn.get("metrics"), "response_id": response.get("id"),
             "provider": response.get("provider"), "finish_reason": choice.get("finish_reason"),
             "request_seed": _object(turn.get("request")).get("seed")}
    for key in ("turn", "phase", "action", "final_correct", "unexpected_tool_calls"):
        if key in turn:
            extra[key] = turn[key]
    return extra


def _branch_messages(turns: list[Any], origin: str, branch: str) -> tuple[list[Any], int]:
    """The whole recorded transcript of a branch and the fork's message index."""
    where = f"branches.{branch}.turns"
    if not turns or not all(isinstance(t, dict) for t in turns):
        raise refusal(origin, "must be a non-empty list of turn objects", field_name=where)
    requests: list[list[Any]] = []
    for number, turn in enumerate(turns):
        messages = _object(turn.get("request")).get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise refusal(origin, "must be a list of message objects",
                          field_name=f"{where}[{number}].request.messages")
        requests.append(messages)
    first = requests[0]
    if len(first) < 2 or first[-1].get("role") != "tool" or first[-2].get("role") != "assistant":
        raise refusal(origin, "the first postfork request must end with the fork's assistant "
                      "turn and its tool result", index=len(first) - 1,
                      field_name=f"{where}[0].request.messages")
    transcript = [dict(m) for m in first]
    sent = len(first)  # how many transcript messages the latest request contained
    for number, turn in enumerate(turns):
        following = requests[number + 1] if number + 1 < len(requests) else None
        if following is not None and following[:sent] != requests[number]:
            raise refusal(origin, "a turn's request is not the previous request plus its "
                          "response; the record is inconsistent",
                          field_name=f"{where}[{number + 1}].request.messages")
        response = _first_choice(turn).get("message")
        if not isinstance(response, dict):
            raise refusal(origin, "missing", field_name=f"{where}[{number}].response.message")
        assistant = dict(following[sent]) if following is not None else _echo(response)
        assistant["extra"] = _turn_extra(turn)
        transcript.append(assistant)
        if following is not None:
            transcript.extend(dict(m) for m in following[sent + 1:])
            sent = len(following)
    return transcript, len(first) - 2


def study_histories_from_data(data: Any, path: str | Path, *, task: str | None = None,
                              fork: int | None = None) -> dict[str, History]:
    """Both arms of a parsed study record: {"clean": History, "external": History}."""
    origin = str(path)
    if not is_study_record(data):
        raise refusal(origin, "not a study continuation record (expected 'branches' with "
                      "'clean' and 'rewritten', and 'continuation_seed')")
    record = {k: v for k, v in data.items() if k != "branches"}
    histories: dict[str, History] = {}
    for branch_name, arm in BRANCH_ARMS.items():
        branch = data["branches"].get(branch_name)
        if not isinstance(branch, dict):
            raise refusal(origin, "missing", field_name=f"branches.{branch_name}")
        transcript, marked = _branch_messages(branch.get("turns") or [], origin, branch_name)
        if fork is not None and fork != marked:
            raise refusal(origin, f"the record fixes its fork at message {marked}; a different "
                          "fork would break the clean/external pairing (omit fork=)",
                          index=fork, field_name="fork")
        request = branch["turns"][0]["request"]
        summary = {k: v for k, v in branch.items() if k != "turns"}
        provenance = {
            "model": _object(data.get("model")).get("model"),
            "sampling": {k: request[k] for k in SAMPLING_KEYS if k in request},
            "study": {**record, "branch": branch_name, "outcome": summary},
            "compressor": None if arm == "clean" else COMPRESSOR_NOTE,
        }
        histories[arm] = build_history(
            transcript, origin=origin, task=task or str(data.get("task_id") or ""), arm=arm,
            fork=marked, source=source_record("shortreasoning-study", path),
            provenance=provenance, tools=copy.deepcopy(request.get("tools")), marked_fork=True)
    return histories


def import_study_record(path: str | Path, *, task: str | None = None,
                        fork: int | None = None) -> dict[str, History]:
    """Import one study record as {"clean": ..., "external": ...}."""
    return study_histories_from_data(parse_json_file(path), path, task=task, fork=fork)


def write_study_histories(src_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Convert every `*__rep-*.json` under `src_dir` into `out_dir/<stem>/{clean,external}.json`.
    Returns the written paths."""
    records = sorted(Path(src_dir).glob("*__rep-*.json"))
    if not records:
        raise HistoryError(f"{src_dir}: no study records (*__rep-*.json) found")
    written: list[Path] = []
    for record in records:
        for arm, history in import_study_record(record).items():
            target = Path(out_dir) / record.stem / f"{arm}.json"
            save_history(history, target)
            written.append(target)
    return written
