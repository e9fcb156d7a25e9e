"""Per-request serving figures under the names `vllm bench serve --save-result` uses, and the
tidy per-request table (`requests.parquet`), both pure functions of a run's records.

For each regime and request source (an arm, `<arm>/compressor`, `background`), over the
requests that belong to the regime's blocks:

- `completed` / `failed`: requests that ended ok / with an error;
- `duration`: seconds the regime's blocks span (the union of their start-end spans); requests
  per second and tokens per second are per that duration (`request_throughput`,
  `output_throughput`, `total_token_throughput`), as vLLM divides by its benchmark's duration;
- `{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms`: time to first token (first token -
  actual send), time per output token ((e2el - ttft) / (output tokens - 1), requests with more
  than one token), inter-token latency (every gap between streamed chunks), end-to-end latency
  (end - actual send), over completed requests, in milliseconds;
- `{mean,median,p90,p99}_e2el_intended_ms`: end - *intended* send, where the schedule fixed one
  (background load), which keeps coordinated omission visible: a late send hides its wait from
  `e2el` but not from this.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from compaction_bench.bench.runfolder import RunRecords, arm_sort_key, regime_sort_key
from compaction_bench.transport.client import RequestRecord

QUANTITIES = ("ttft", "tpot", "itl", "e2el", "e2el_intended")


def _union_length(spans: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _stats(values: pd.Series, *, with_std: bool) -> dict[str, float | None]:
    data = values.to_numpy(dtype=float) * 1000.0
    if data.size == 0:
        keys = ("mean", "median", "std", "p90", "p99") if with_std else (
            "mean", "median", "p90", "p99")
        return dict.fromkeys(keys, None)
    out: dict[str, float | None] = {"mean": float(np.mean(data)),
                                    "median": float(np.median(data))}
    if with_std:
        out["std"] = float(np.std(data))
    out["p90"] = float(np.percentile(data, 90))
    out["p99"] = float(np.percentile(data, 99))
    return out


def request_values(request: RequestRecord) -> dict[str, Any]:
    """A request's derived latencies in seconds (None where it has none)."""
    ok = request.status == "ok"
    ttft = (request.first_token_s - request.sent_s
            if ok and request.first_token_s is not None else None)
    e2el = request.end_s - request.sent_s if ok and request.end_s is not None else None
    intended = (request.end_s - request.intended_send_s
                if ok and request.end_s is not None and request.intended_send_s is not None
                else None)
    tokens = request.completion_tokens
    tpot = ((e2el - ttft) / (tokens - 1) if e2el is not None and ttft is not None and tokens
            and tokens > 1 else None)
    gaps = [float(g) for g in np.diff(request.chunk_times_s)] if ok else []
    return {"ttft": ttft, "e2el": e2el, "e2el_intended": intended, "tpot": tpot, "itl": gaps}


def figures(rows: pd.DataFrame, duration: float) -> dict[str, Any]:
    """vLLM-named figures of one group of `requests_table` rows over `duration` seconds."""
    ok = rows[rows["status"] == "ok"]
    out: dict[str, Any] = {
        "completed": len(ok), "failed": len(rows) - len(ok), "duration": duration,
        "total_input_tokens": int(ok["prompt_tokens"].fillna(0).sum()),
        "total_output_tokens": int(ok["completion_tokens"].fillna(0).sum()),
    }
    out["request_throughput"] = len(ok) / duration if duration > 0 else None
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else None
    out["total_token_throughput"] = ((out["total_input_tokens"] + out["total_output_tokens"])
                                     / duration if duration > 0 else None)
    for quantity in QUANTITIES:
        if quantity == "itl":  # every gap between streamed chunks, of every completed request
            sample = ok["chunk_times_s"].map(np.diff).explode().dropna()
        else:
            sample = ok[f"{quantity}_s"].dropna()
        for stat, value in _stats(sample, with_std=quantity != "e2el_intended").items():
            out[f"{stat}_{quantity}_ms"] = value
    return out


def serving_figures(records: RunRecords) -> dict[str, dict[str, dict[str, Any]]]:
    """{regime: {source: figures}} over the requests inside each regime's blocks, grouped from
    the per-request table. A run with no block spans (imported study runs) uses each group's
    own first send to last end."""
    spans: dict[tuple[str, int], tuple[float, float]] = {
        (b.regime, b.block): (b.started_s, b.ended_s) for b in records.blocks
        if b.started_s is not None and b.ended_s is not None}
    frame = requests_table(records)
    inside = frame["block"].notna()
    if spans:
        inside &= pd.Series([(r, int(b)) in spans if not pd.isna(b) else False
                             for r, b in zip(frame["regime"], frame["block"], strict=True)],
                            index=frame.index, dtype=bool)
    groups: dict[tuple[str, str], pd.DataFrame] = {
        (str(regime), str(source)): rows for (regime, source), rows
        in frame[inside].groupby(["regime", "source"], sort=False, dropna=False)}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for regime, source in sorted(groups, key=lambda k: (regime_sort_key(k[0]),
                                                        arm_sort_key(k[1]))):
        rows = groups[(regime, source)]
        regime_spans = [v for k, v in spans.items() if k[0] == regime]
        if regime_spans:
            duration = _union_length(regime_spans)
        else:
            ends = rows["end_s"].dropna()
            duration = float(ends.max() - rows["sent_s"].min()) if len(ends) else 0.0
        out.setdefault(regime, {})[source] = figures(rows, duration)
    return out


def requests_table(records: RunRecords) -> pd.DataFrame:
    """One row per request: every record field, labels as a JSON string, and the derived
    latencies in seconds (`ttft_s`, `tpot_s`, `e2el_s`, `e2el_intended_s`, `itl_mean_s`,
    `send_lag_s`, `chunks`)."""
    rows = []
    for request in records.requests:
        derived = request_values(request)
        row = request.to_json()
        row["labels"] = json.dumps(request.labels, sort_keys=True, ensure_ascii=False)
        row["spec_decode"] = (json.dumps(request.spec_decode, sort_keys=True)
                              if request.spec_decode is not None else None)
        row["chunk_times_s"] = list(request.chunk_times_s)
        row.update({
            "ttft_s": derived["ttft"], "tpot_s": derived["tpot"], "e2el_s": derived["e2el"],
            "e2el_intended_s": derived["e2el_intended"],
            "itl_mean_s": float(np.mean(derived["itl"])) if derived["itl"] else None,
            "send_lag_s": (request.sent_s - request.intended_send_s
                           if request.intended_send_s is not None else None),
            "chunks": len(request.chunk_times_s)})
        rows.append(row)
    columns = [*RequestRecord.__dataclass_fields__, "ttft_s", "tpot_s", "e2el_s",
               "e2el_intended_s", "itl_mean_s", "send_lag_s", "chunks"]
    frame = pd.DataFrame(rows, columns=columns)
    for name in ("block", "prompt_tokens", "cached_tokens", "completion_tokens",
                 "reasoning_tokens", "http_status"):
        frame[name] = frame[name].astype("Int64")
    return frame
