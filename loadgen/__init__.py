"""Load generation: sends requests and records them.

- `sse`: our streaming client (every SSE event stamped on arrival, time.monotonic).
- `fakeserver`: a fake OpenAI-compatible server with exactly known delays (for accuracy tests).
- `config`, `replay`: background-load configuration; recorded histories as turn plans.
- `background` + `locustmain`: the locust user and process entry (imported only in locust
  processes, which import locust first); `runner.BackgroundLoad` starts/stops them.
- `metrics`, `gpu`: /metrics and NVML samplers; `records`: the append-only JSONL writer.
- `client_bench`: the client accuracy benchmark (`python -m loadgen.client_bench`).
"""
