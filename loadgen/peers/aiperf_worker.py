"""One client-accuracy measurement with NVIDIA AIPerf's HTTP client (`make bench-client`).

Runs in the AIPerf peer environment (`.cache/peers/aiperf`, see `loadgen.client_bench`), not in
the suite's: it imports AIPerf and nothing of ours. `streams` concurrent streaming chat requests
per round go through `aiperf.transports.aiohttp_client.AioHttpClient.post_request` (AIPerf's own
connector settings, SSE reader and `perf_counter_ns` stamps); TTFT and inter-token gaps are
computed as AIPerf's metrics define them: first content response minus request start, and the
gaps between content responses. Prints one JSON line: {"ttft", "itl", "errors", "cpu_s"}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import time
from typing import Any

from aiperf.transports.aiohttp_client import AioHttpClient


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _content(message: Any) -> bool:
    """Whether an SSE message carries generated text (what AIPerf counts as a content response)."""
    try:
        data = message.get_json()
    except Exception:  # AIPerf's own parser decides; a message it cannot read carries nothing
        return False
    if not isinstance(data, dict):
        return False
    for choice in data.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


async def measure(url: str, streams: int, rounds: int, tokens: int) -> dict[str, Any]:
    client = AioHttpClient(timeout=3600)
    body = json.dumps({"model": "target", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "Say something."}]}).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    ttft: list[float] = []
    itl: list[float] = []
    errors: list[str] = []
    cpu0, wall0 = _cpu(), time.monotonic()
    try:
        for _ in range(rounds):
            records = await asyncio.gather(*(
                client.post_request(url + "/chat/completions", body, headers)
                for _ in range(streams)))
            for record in records:
                if record.error is not None:
                    errors.append(str(record.error)[-200:])
                    continue
                stamps = [m.perf_ns for m in record.responses if _content(m)]
                if not stamps:
                    errors.append("no content response")
                    continue
                ttft.append((stamps[0] - record.start_perf_ns) / 1e9)
                itl.extend((b - a) / 1e9 for a, b in itertools.pairwise(stamps))
    finally:
        await client.close()
    return {"ttft": ttft, "itl": itl, "errors": errors, "cpu_s": _cpu() - cpu0,
            "wall_s": time.monotonic() - wall0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.url, args.streams, args.rounds, args.tokens))))


if __name__ == "__main__":
    main()
