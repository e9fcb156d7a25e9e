"""How accurate and how cheap are the suite's clients? Prints figures (a benchmark, not a test).

    python -m compaction_bench.loadgen.client_bench            # `make bench-client`

1. Accuracy against the fake server (`loadgen/fakeserver.py`, default 200 ms to the first
   token, 20 ms between tokens), at 1, 64 and 256 concurrent streams, side by side in one run:
   - `arm`: the arms' path, `histories.agent.chat.ChatModel.request` in plain threads (one
     client per arm thread, as a block runs them; it is `transport.client.StreamClient`);
   - `background`: `StreamClient` under gevent's monkey-patching, as the locust users run it;
   - `vllm`: vLLM's own benchmark request function (asyncio + aiohttp);
   - `aiperf`: NVIDIA AIPerf's HTTP client (`aiperf.transports.AioHttpClient`, its SSE parser
     and its per-chunk `perf_counter_ns` stamps), in its own virtual environment
     (`.cache/peers/aiperf`, made on first use: AIPerf pins pandas/psutil versions the suite
     does not use).
   Each client runs in a fresh process of its own, one after the other, so CPU is its own and
   nobody competes. Error = measured minus the fake's configured delay; the fake's own write
   lateness (its event loop waking late) is printed beside it, since it is in every client's
   error. CPU = the client process's CPU seconds per stream.
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

import numpy as np
import psutil

from compaction_bench.common.net import DEFAULT_PORT
from compaction_bench.common.paths import cache_dir
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.endpoints import is_healthy

CLIENTS = ("arm", "background", "vllm", "aiperf")
MESSAGES = [{"role": "user", "content": "Say something."}]
AIPERF = "aiperf==0.13.0"
PEER_DIR = "peers"


# --- workers: one process per (client, concurrency) ---------------------------------------

def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ours(url: str, streams: int, rounds: int, tokens: int, mode: str) -> dict[str, Any]:
    from compaction_bench.histories.agent.chat import ChatModel, ChatModelConfig
    from compaction_bench.transport.client import StreamClient, prepare

    ttft: list[float] = []
    itl: list[float] = []
    errors: list[str] = []

    def arm_send(index: int, model: ChatModel) -> None:
        model.config = model.config.model_copy(update={"max_tokens": tokens})
        try:
            record = model.request(MESSAGES).record
        except Exception as exc:  # a failed request: counted, never raised
            errors.append(str(exc))
            return
        take(record)

    def background_send(index: int, client: StreamClient) -> None:
        request = prepare(url, {"model": "target", "messages": MESSAGES, "max_tokens": tokens},
                          request_id=f"b{index}")
        take(client.send(request).record)

    def take(record: Any) -> None:
        if record.status != "ok" or record.first_token_s is None:
            errors.append(record.error or "no token")
            return
        ttft.append(record.first_token_s - record.sent_s)
        itl.extend(np.diff(record.chunk_times_s).tolist())

    cpu0, wall0 = _cpu(), time.monotonic()
    if mode == "arm":
        config = ChatModelConfig(api_url=url, protocol="text", seed=None, temperature=0.0)
        models = [ChatModel(config) for _ in range(streams)]
        for r in range(rounds):
            threads = [threading.Thread(target=arm_send, args=(r * streams + i, m))
                       for i, m in enumerate(models)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    else:
        import gevent

        clients = [StreamClient() for _ in range(streams)]
        for r in range(rounds):
            gevent.joinall([gevent.spawn(background_send, r * streams + i, c)
                            for i, c in enumerate(clients)])
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
    parser.add_argument("--client", choices=("arm", "background", "vllm"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args(argv)
    if args.client == "vllm":
        out = _vllm(args.url, args.streams, args.rounds, args.tokens)
    else:
        out = _ours(args.url, args.streams, args.rounds, args.tokens, args.client)
    print(json.dumps(out))


# --- the AIPerf peer, in its own environment --------------------------------------------------

def aiperf_python(*, install: bool = True) -> Path | None:
    """The Python of the AIPerf peer environment (made once, from the package registry)."""
    venv = cache_dir() / PEER_DIR / "aiperf"
    python = venv / "bin" / "python"
    if python.is_file() and (venv / ".installed").is_file():
        return python
    if not install:
        return None
    print(f"(installing {AIPERF} into {venv} for the peer comparison, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", AIPERF],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"AIPerf could not be installed: {done.stderr.strip()[-400:]}", flush=True)
        return None
    (venv / ".installed").write_text(AIPERF + "\n")
    return python


def _measure(client: str, url: str, streams: int, rounds: int, tokens: int,
             aiperf: Path | None) -> dict[str, Any] | None:
    args = ["--url", url, "--streams", str(streams), "--rounds", str(rounds),
            "--tokens", str(tokens)]
    if client == "aiperf":
        if aiperf is None:
            return None
        script = Path(__file__).with_name("peers") / "aiperf_worker.py"
        command = [str(aiperf), str(script), *args]
    elif client == "background":  # patched first, as locust does
        command = [sys.executable, "-c", "from gevent import monkey; monkey.patch_all(); "
                   "from loadgen.client_bench import worker_main; worker_main()",
                   "--client", client, *args]
    else:
        command = [sys.executable, "-c", "from loadgen.client_bench import worker_main; "
                   "worker_main()", "--client", client, *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        print(f"  {client}: worker failed: {done.stderr.strip()[-500:]}", flush=True)
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the accuracy table ---------------------------------------------------------------------

def _q(values: list[float], p: float) -> float:
    return float(np.quantile(values, p)) if values else float("nan")


def _summarize(client: str, streams: int, r: dict[str, Any], ttft_ms: float, itl_ms: float,
               late_s: float) -> dict[str, Any]:
    n = len(r["ttft"])
    ttft = [(t * 1000 - ttft_ms) for t in r["ttft"]]
    itl = [(t * 1000 - itl_ms) for t in r["itl"]]
    return {"streams": streams, "client": client, "n": n,
            "ttft_p50": _q(ttft, .5), "ttft_p99": _q(ttft, .99),
            "itl_p50": _q(itl, .5), "itl_p99": _q(itl, .99),
            "cpu_ms_per_stream": r["cpu_s"] * 1000 / max(1, n),
            "fake_late_p99": late_s * 1000, "errors": len(r["errors"])}


STATS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "cpu_ms_per_stream", "fake_late_p99")


def accuracy(ttft_ms: float, itl_ms: float, tokens: int, levels: list[int],
             clients: tuple[str, ...], repetitions: int) -> list[dict[str, Any]]:
    """Measure every client at every level `repetitions` times, the clients' order rotating
    between repetitions (this machine is noisy: a burst of interference lands on one client's
    turn, not on all of one client's turns); print the median of each figure over the
    repetitions and the range of the TTFT p50; return the rows."""
    aiperf = aiperf_python() if "aiperf" in clients else None
    print(f"Client accuracy against the fake server ({ttft_ms:.0f} ms TTFT, {itl_ms:.0f} ms "
          f"inter-token, {tokens} tokens per stream); errors = measured - configured, ms; each "
          f"figure the median of {repetitions} repetitions in rotating client order\n")
    head = (f"{'streams':>7} {'client':<11} {'n':>5} {'TTFT err p50':>12} {'(range)':>13} "
            f"{'p99':>7} {'ITL err p50':>11} {'p99':>7} {'CPU ms/stream':>13} "
            f"{'fake late p99':>13} {'errors':>6}")
    print(head)
    print("-" * len(head))
    rows: list[dict[str, Any]] = []
    with FakeProcess(FakeConfig(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)) as fake:
        for streams in levels:
            rounds = 20 if streams == 1 else 2 if streams <= 64 else 1
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
            for rep in range(repetitions):
                order = clients[rep % len(clients):] + clients[:rep % len(clients)]
                for client in order:
                    fake.stats(reset=True)
                    r = _measure(client, fake.api_url, streams, rounds, tokens, aiperf)
                    if r is not None:
                        late = fake.stats()["lateness_p99_s"] or 0.0
                        runs[client].append(_summarize(client, streams, r, ttft_ms, itl_ms,
                                                       late))
            for client in clients:
                reps = runs[client]
                if not reps:
                    print(f"{streams:>7} {client:<11} not measured (see above)", flush=True)
                    continue
                row = {"streams": streams, "client": client, "repetitions": len(reps),
                       "n": sum(x["n"] for x in reps), "errors": sum(x["errors"] for x in reps),
                       **{k: float(np.median([x[k] for x in reps])) for k in STATS},
                       "ttft_p50_range": [min(x["ttft_p50"] for x in reps),
                                          max(x["ttft_p50"] for x in reps)]}
                rows.append(row)
                low, high = row["ttft_p50_range"]
                print(f"{streams:>7} {client:<11} {row['n']:>5} {row['ttft_p50']:>12.2f} "
                      f"{f'{low:.1f}-{high:.1f}':>13} {row['ttft_p99']:>7.2f} "
                      f"{row['itl_p50']:>11.2f} {row['itl_p99']:>7.2f} "
                      f"{row['cpu_ms_per_stream']:>13.2f} {row['fake_late_p99']:>13.2f} "
                      f"{row['errors']:>6}", flush=True)
    return rows


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Where our clients stand against the targets: at every load no worse than the best peer
    (p50 and p99 of both errors, absolute), and p50 <= 2 ms, p99 <= 10 ms at 64 streams."""
    lines = []
    for streams in sorted({r["streams"] for r in rows}):
        level = [r for r in rows if r["streams"] == streams]
        peers = [r for r in level if r["client"] in ("vllm", "aiperf")]
        for ours in (r for r in level if r["client"] in ("arm", "background")):
            worse = []
            for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
                best = min((abs(p[key]) for p in peers), default=None)
                if best is not None and abs(ours[key]) > best:
                    worse.append(f"{key} {abs(ours[key]):.2f} > best peer {best:.2f}")
            if streams == 64:
                worse += [f"{k} {abs(ours[k]):.2f} > 2 ms" for k in ("ttft_p50", "itl_p50")
                          if abs(ours[k]) > 2]
                worse += [f"{k} {abs(ours[k]):.2f} > 10 ms" for k in ("ttft_p99", "itl_p99")
                          if abs(ours[k]) > 10]
            lines.append(f"{streams:>4} streams, {ours['client']}: "
                         + ("meets the targets" if not worse else "; ".join(worse)))
    return lines


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


def loadgen_cpu(url: str, users: int, arms: int, window_s: float, *, label: str,
                pace: float | None, max_model_len: int) -> None:
    from compaction_bench.loadgen.background import BackgroundConfig, BackgroundLoad
    from compaction_bench.transport.client import StreamClient, prepare
    from compaction_bench.transport.wire import ReplayOptions

    with tempfile.TemporaryDirectory() as tmp:
        config = BackgroundConfig(
            server_url=url, users=users, regime="bench-client", out=Path(tmp) / "req.jsonl",
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--levels", default="1,64,256", help="concurrent streams to measure")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"comma-separated subset of {', '.join(CLIENTS)}")
    parser.add_argument("--repetitions", type=int, default=3,
                        help="measurements per client and level (medians are printed)")
    parser.add_argument("--window-s", type=float, default=20.0, help="CPU measuring window")
    parser.add_argument("--vllm-url", default=f"http://127.0.0.1:{DEFAULT_PORT}",
                        help="a running vLLM server for the cpu-tiny overloaded figure")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args(argv)
    clients = tuple(c for c in args.clients.split(",") if c)
    if unknown := [c for c in clients if c not in CLIENTS]:
        parser.error(f"unknown client(s) {unknown}; known: {', '.join(CLIENTS)}")
    print(f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}\n")
    if not args.skip_accuracy:
        rows = accuracy(args.ttft_ms, args.itl_ms, args.tokens,
                        [int(v) for v in args.levels.split(",")], clients, args.repetitions)
        print("\nAgainst the targets (absolute errors, ms):")
        for line in verdict(rows):
            print("  " + line)
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.skip_load:
        return
    print("\nLoad generator CPU (cores = CPU seconds / wall seconds)")
    with FakeProcess(FakeConfig(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms)) as fake:
        loadgen_cpu(fake.server_url, 64, 3, args.window_s,
                    label="fake server, 64 users + 3 arms", pace=1000 / args.itl_ms,
                    max_model_len=8192)
    if not is_healthy(args.vllm_url):
        print(f"cpu-tiny overloaded (8 users): not measured, no server answers /health at "
              f"{args.vllm_url}; start one with `make serve`")
        return
    loadgen_cpu(args.vllm_url, 8, 0, args.window_s, label="vLLM cpu-tiny, overloaded 8 users",
                pace=None, max_model_len=8192)


if __name__ == "__main__":
    main()
