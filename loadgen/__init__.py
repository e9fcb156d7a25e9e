"""Load generation: sends requests and records them.

- `client`: the one streaming client (arms, compressors and background users all send through
  it) and `RequestRecord`, the one request record type; `sse`: SSE and chunked decoding.
- `fakeserver`: the fake OpenAI-compatible server with exactly known delays, scripted replies
  and injected faults (for accuracy and fault tests).
- `background`: the background load's config and `BackgroundLoad`, which starts/stops the
  locust processes (`locust_main`, `locust_user`: imported only there, locust first);
  `schedule`: recorded histories as background users' schedules of turns.
- `metrics`, `gpu`: /metrics and NVML samplers (the server's endpoints and NVML are opened
  through `serve.endpoints` and `serve.hardware`).
- `client_bench`: the client accuracy benchmark (`make bench-client`).
"""
