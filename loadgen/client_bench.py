"""How accurate and how cheap is our streaming client? Prints figures (not a timed test).

    python -m loadgen.client_bench            # `make bench-client`

1. Against the fake server (`loadgen/fakeserver.py`, default 200 ms to first token, 20 ms
   between tokens), at 1, 64 and 256 concurrent streams, side by side in one run: our client in
   plain threads, our client under gevent (as inside locust), and vLLM's own benchmark request
   function (`vllm.benchmarks.lib.endpoint_request_func`, asyncio + aiohttp). Each client runs
   in a fresh process of its own, one after the other, so CPU is its own and nobody competes.
   Error = measured minus the fake's configured delay; the fake's own write lateness (its event
   loop waking late) is printed beside it, since it is in every client's error.
2. The load generator's CPU: 64 background users (locust) plus 3 arm-like client threads
   against the fake server, and the cpu-tiny overloaded regime (8 users) against a real vLLM
   server when one answers at `--vllm-url`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from loadgen.fakeserver import FakeConfig, FakeProcess

CLIENTS = ("ours-threads", "ours-gevent", "vllm")
MESSAGES = [{"role": "user", "content": "Say something."}]


# --- workers: one process per (client, concurrency) ---------------------------------------

def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ours(url: str, streams: int, rounds: int, tokens: int, gevent_mode: bool) -> dict[str, Any]:
    from loadgen.sse import StreamClient, prepare

    ttft: list[float] = []
    itl: list[float] = []
    errors: list[str] = []
    clients = [StreamClient() for _ in range(streams)]

    def one(client: StreamClient, index: int) -> None:
        request = prepare(url, {"model": "target", "messages": MESSAGES, "max_tokens": tokens},
                          request_id=f"b{index}")
        result = client.send(request)
        if result.status != "ok" or result.first_token_s is None:
            errors.append(result.error or "no token")
            return
        ttft.append(result.first_token_s - result.sent_s)
        itl.extend(np.diff(result.chunk_times_s).tolist())

    cpu0, wall0 = _cpu(), time.monotonic()
    for r in range(rounds):
        if gevent_mode:
            import gevent

            gevent.joinall([gevent.spawn(one, c, r * streams + i) for i, c in enumerate(clients)])
        else:
            threads = [threading.Thread(target=one, args=(c, r * streams + i))
                       for i, c in enumerate(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    return {"ttft": ttft, "itl": itl, "errors": errors, "cpu_s": _cpu() - cpu0,
            "wall_s": time.monotonic() - wall0}


def _vllm(url: str, streams: int, rounds: int, tokens: int) -> dict[str, Any]:
    import asyncio

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_chat_completions,
    )

    async def run() -> dict[str, Any]:
        ttft: list[float] = []
        itl: list[float] = []
        errors: list[str] = []
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=3600)) as session:
            cpu0, wall0 = _cpu(), time.monotonic()
            for _ in range(rounds):
                inputs = [RequestFuncInput(prompt="", api_url=url + "/chat/completions",
                                           prompt_len=1, output_len=tokens, model="target",
                                           chat_messages=MESSAGES) for _ in range(streams)]
                outputs = await asyncio.gather(*(
                    async_request_openai_chat_completions(i, session) for i in inputs))
                for out in outputs:
                    if not out.success:
                        errors.append(out.error[-200:])
                        continue
                    ttft.append(out.ttft)
                    itl.extend(out.itl)
            return {"ttft": ttft, "itl": itl, "errors": errors, "cpu_s": _cpu() - cpu0,
                    "wall_s": time.monotonic() - wall0}

    return asyncio.run(run())


def worker_main(argv: list[str] | None = None) -> None:
    """One measurement; prints its JSON on the last stdout line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args(argv)
    if args.client == "vllm":
        out = _vllm(args.url, args.streams, args.rounds, args.tokens)
    else:
        out = _ours(args.url, args.streams, args.rounds, args.tokens,
                    args.client == "ours-gevent")
    print(json.dumps(out))


def _measure(client: str, url: str, streams: int, rounds: int, tokens: int) -> dict[str, Any]:
    worker = ["-c", "from loadgen.client_bench import worker_main; worker_main()"]
    if client == "ours-gevent":  # patched first, as locust does
        worker = ["-c", "from gevent import monkey; monkey.patch_all(); "
                        "from loadgen.client_bench import worker_main; worker_main()"]
    done = subprocess.run([sys.executable, *worker, "--client", client, "--url", url,
                           "--streams", str(streams), "--rounds", str(rounds),
                           "--tokens", str(tokens)], capture_output=True, text=True,
                          check=True, timeout=600)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the accuracy table ---------------------------------------------------------------------

def _q(values: list[float], p: float) -> float:
    return float(np.quantile(values, p)) if values else float("nan")


def accuracy(ttft_ms: float, itl_ms: float, tokens: int, levels: list[int]) -> None:
    print(f"Client accuracy against the fake server ({ttft_ms:.0f} ms TTFT, {itl_ms:.0f} ms "
          f"inter-token, {tokens} tokens per stream); errors = measured - configured, ms\n")
    head = (f"{'streams':>7} {'client':<13} {'n':>5} {'TTFT mean':>9} {'TTFT err p50':>12} "
            f"{'p99':>7} {'ITL err p50':>11} {'p99':>7} {'CPU ms/stream':>13} {'fake late p99':>13}"
            f" {'errors':>6}")
    print(head)
    print("-" * len(head))
    with FakeProcess(FakeConfig(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)) as fake:
        for streams in levels:
            rounds = 20 if streams == 1 else 2 if streams <= 64 else 1
            for client in CLIENTS:
                fake.stats(reset=True)
                r = _measure(client, fake.api_url, streams, rounds, tokens)
                late = fake.stats()["lateness_p99_s"] or 0.0
                n = len(r["ttft"])
                ttft = [(t * 1000 - ttft_ms) for t in r["ttft"]]
                itl = [(t * 1000 - itl_ms) for t in r["itl"]]
                print(f"{streams:>7} {client:<13} {n:>5} {np.mean(r['ttft']) * 1000:>9.1f} "
                      f"{_q(ttft, .5):>12.2f} {_q(ttft, .99):>7.2f} {_q(itl, .5):>11.2f} "
                      f"{_q(itl, .99):>7.2f} {r['cpu_s'] * 1000 / max(1, n):>13.2f} "
                      f"{late * 1000:>13.2f} {len(r['errors']):>6}", flush=True)


# --- the load generator's CPU -----------------------------------------------------------------

def _tree_cpu(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def loadgen_cpu(base_url: str, users: int, arms: int, window_s: float, *, label: str,
                pace: float | None, max_model_len: int) -> None:
    from loadgen.config import BackgroundConfig, ReplayOptions
    from loadgen.runner import BackgroundLoad
    from loadgen.sse import StreamClient, prepare

    with tempfile.TemporaryDirectory() as tmp:
        config = BackgroundConfig(
            base_url=base_url, users=users, regime="bench-client", out=Path(tmp) / "req.jsonl",
            spawn_rate=max(1.0, users / 2), duration_s=window_s + 120,
            max_model_len=max_model_len, replay=ReplayOptions(pace_tokens_per_s=pace))
        stop = threading.Event()

        def arm(index: int) -> None:  # an arm client: back-to-back streams, as a continuation
            client = StreamClient()
            while not stop.is_set():
                client.send(prepare(config.api_url, {"model": "target", "messages": MESSAGES,
                                                     "max_tokens": 200}, request_id=f"arm{index}"))

        with BackgroundLoad(config) as load:
            load.wait_steady(timeout_s=120)
            assert load.process is not None
            threads = [threading.Thread(target=arm, args=(i,), daemon=True) for i in range(arms)]
            for t in threads:
                t.start()
            cpu0, own0, t0 = _tree_cpu(load.process.pid), _cpu(), time.monotonic()
            time.sleep(window_s)
            cpu1, own1, t1 = _tree_cpu(load.process.pid), _cpu(), time.monotonic()
            status = load.status()
            stop.set()
        wall = t1 - t0
        rows = [r for r in map(json.loads, (Path(tmp) / "req.jsonl").read_text().splitlines())
                if r.get("first_token_s") is not None and t0 - config.origin <= r["sent_s"]]
        ttft = [(r["first_token_s"] - r["sent_s"]) * 1000 for r in rows]
        lag = [(r["sent_s"] - r["intended_send_s"]) * 1000 for r in rows]
        print(f"{label}: locust {(cpu1 - cpu0) / wall:.3f} cores + {arms} arm threads and "
              f"bench process {(own1 - own0) / wall:.3f} cores = "
              f"{(cpu1 - cpu0 + own1 - own0) / wall:.3f} cores over {wall:.0f} s; "
              f"{status.done} requests done, {status.in_flight} in flight; background TTFT p50 "
              f"{_q(ttft, .5):.1f} ms p99 {_q(ttft, .99):.1f} ms; send lag p50 {_q(lag, .5):.1f}"
              f" ms max {max(lag, default=float('nan')):.0f} ms", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--levels", default="1,64,256", help="concurrent streams to measure")
    parser.add_argument("--window-s", type=float, default=20.0, help="CPU measuring window")
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8000",
                        help="a running vLLM server for the cpu-tiny overloaded figure")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args(argv)
    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}\n")
    if not args.skip_accuracy:
        accuracy(args.ttft_ms, args.itl_ms, args.tokens,
                 [int(v) for v in args.levels.split(",")])
    if args.skip_load:
        return
    print("\nLoad generator CPU (cores = CPU seconds / wall seconds)")
    with FakeProcess(FakeConfig(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms)) as fake:
        loadgen_cpu(fake.base_url, 64, 3, args.window_s, label="fake server, 64 users + 3 arms",
                    pace=1000 / args.itl_ms, max_model_len=8192)
    try:
        httpx.get(args.vllm_url.rstrip("/") + "/health", timeout=3).raise_for_status()
    except httpx.HTTPError as exc:
        print(f"cpu-tiny overloaded (8 users): skipped, no server at {args.vllm_url} ({exc}); "
              "start one with `make serve`")
        return
    loadgen_cpu(args.vllm_url, 8, 0, args.window_s, label="vLLM cpu-tiny, overloaded 8 users",
                pace=None, max_model_len=8192)


if __name__ == "__main__":
    main()
