"""The serve-time self-check: after `/health` and before any block or sweep, on every profile.

`run_selfcheck(api_url, profile)` checks, against the live server, through the suite's one
streaming client for chat requests (`transport.client`) and its one client of the server's own
endpoints (`serve.endpoints`), what the experiment silently depends on:

1. served names: every name of the profile is listed by `/v1/models` and answers a request;
2. prefix cache: a prompt of several KV blocks (at the profile's block size, else the size the
   server reports) sent twice reports cached tokens on the second request, a whole number of
   blocks. The prompt opens with a fresh nonce, so the first request starts cold;
3. /metrics: vLLM's prefix-cache counters move with it (hits by at least the cached tokens);
4. branch: a prompt that shares its first three quarters with the first one reports cached
   tokens too. This is a compacted arm's case (history equal up to a rewritten block, then
   different); with DeepSeek V4's sliding-window cache it needs a retention interval;
5. reasoning (native-reasoning profiles): a thinking request returns reasoning in the message's
   `reasoning` / `reasoning_content` field, which the history format reads;
6. tool call (tool-calling profiles): a tool request returns a parsed tool call;
7. server: `/version` and the engine's effective cache arguments (`vllm:cache_config_info`)
   agree with the profile: prefix caching on, the same block size and retention interval, at
   least the profile's minimum vLLM, speculative decoding only where the profile turns it on.

The result is a `SelfCheckReport`; any failure raises `SelfCheckError` (exit code UNAVAILABLE)
after every check has run, its first line naming the first failure and the likely fix. The
served names are checked first; if none answers, nothing else is tried.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from compaction_bench.common.net import api_url as to_api_url
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.serve.checkreport import CheckResult, SelfCheckError, SelfCheckReport
from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints, parse_metrics
from compaction_bench.serve.engineinfo import check_server, int_label
from compaction_bench.serve.profile import Profile
from compaction_bench.transport.client import Response, StreamClient, prepare

__all__ = ["CheckResult", "SelfCheckError", "SelfCheckReport", "prompt_plan", "run_selfcheck",
           "selfcheck_plan"]

DEFAULT_BLOCK = 16  # vLLM's CUDA default, used only when neither profile nor server says
BLOCKS_PER_UNIT = 4  # the repeated prompt spans this many units (a block or a retention span)
TOKENS_PER_SENTENCE = 10  # about a floor across tokenizers (SmolLM2 measured: 15.7)
METRICS_WAIT_S = 10.0  # vLLM publishes counters with the engine's next stats update
RETENTION_FIX = ("see the retention setting (engine_args.prefix_cache_retention_interval; vLLM "
                 ">= 0.29 and the DeepSeek V4 retention fix, vllm PR #43447) and that prefix "
                 "caching is on")
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def prompt_plan(profile: Profile, server_block: int | None = None) -> dict[str, int]:
    """Block size, retention unit and target prompt length of the cache probes: the repeated
    prompt spans `BLOCKS_PER_UNIT` units of max(block, retention) plus a block, capped at half
    of max_model_len."""
    block = profile.block_size or server_block or DEFAULT_BLOCK
    unit = max(block, profile.engine_args.prefix_cache_retention_interval or 0)
    target = min(BLOCKS_PER_UNIT * unit + block, profile.engine_args.max_model_len // 2)
    return {"block": block, "unit": unit, "target_tokens": target,
            "sentences": math.ceil(target / TOKENS_PER_SENTENCE)}


def selfcheck_plan(profile: Profile) -> list[str]:
    """What the self-check will send, for `make serve DRY_RUN=1` (nothing is sent)."""
    plan = prompt_plan(profile)
    names = ", ".join(profile.model.served_names)
    lines = [
        f"served names: /v1/models lists {names}; each answers a 4-token request",
        f"prefix cache: a prompt of >= {plan['target_tokens']} tokens ({plan['sentences']} "
        f"sentences; {plan['block']}-token blocks) sent twice; the second must report cached "
        "tokens, a whole number of blocks",
        "/metrics: vllm:prefix_cache_hits grows by at least those cached tokens, "
        "vllm:prefix_cache_queries by the prompt",
        "branch: a prompt sharing its first 3/4 with the first must report cached tokens "
        f"(retention unit {plan['unit']} tokens)",
    ]
    lines.append("reasoning: a thinking request returns a reasoning field" if
                 profile.model.reasoning == "native" else
                 "reasoning: not run (tagged-visible: reasoning is the visible text)")
    lines.append("tool call: a request with one tool returns a parsed tool call" if
                 profile.model.tool_calls else "tool call: not run (the agent uses text actions)")
    lines.append("server: /version >= the profile's minimum; vllm:cache_config_info shows "
                 "prefix caching on, the profile's block size and retention; speculative "
                 f"decoding {'on' if profile.features.speculative_on else 'off'} as the profile")
    return lines


class _Probe:
    """The live server and the requests sent to it (one kept-alive streaming connection)."""

    def __init__(self, url: str, profile: Profile, api_key: str | None, clock: Clock,
                 read_timeout_s: float) -> None:
        self.api_url = to_api_url(url)
        self.profile, self.api_key, self.clock = profile, api_key, clock
        self.stream = StreamClient(read_timeout_s=read_timeout_s, clock=clock)
        self.server = ServerEndpoints(url, api_key=api_key, timeout_s=30.0)
        self.sent = 0

    def close(self) -> None:
        self.stream.close()
        self.server.close()

    def chat(self, payload: dict[str, Any]) -> Response:
        self.sent += 1
        body = {"temperature": 0, **payload}
        return self.stream.send(prepare(self.api_url, body, request_id=f"selfcheck-{self.sent}-"
                                        f"{uuid.uuid4().hex[:8]}", api_key=self.api_key))

    def metrics_text(self) -> str | None:
        try:
            return self.server.metrics_text()
        except EndpointError:
            return None

    def counters(self) -> dict[str, float | None]:
        """The bench's /metrics fields (all None where the server exports none)."""
        try:
            return self.server.metrics()
        except EndpointError:
            return parse_metrics("")

    def tokens(self, messages: list[dict[str, Any]]) -> list[int] | None:
        """The prompt's token ids from vLLM's /tokenize (chat template applied), or None."""
        try:
            return self.server.tokenize_chat(self.profile.model.target_name, messages)
        except EndpointError:
            return None


def _error(response: Response) -> str:
    r = response.record
    return r.error or f"status {r.status}"


def _filler(start: int, count: int, word: str) -> str:
    return " ".join(f"{word} {i}: sensor {i % 17} read {i * 7} units." for i in
                    range(start, start + count))


def _check_names(probe: _Probe) -> CheckResult:
    names = probe.profile.model.served_names
    ids = [m.get("id") for m in probe.server.models() or []]
    missing = [n for n in names if n not in ids]
    failed, others = [], []
    timings: dict[str, float | None] = {}
    answered: dict[str, str | None] = {}  # name asked -> the model the response names
    for name in names:
        response = probe.chat({"model": name, "max_tokens": 4, "messages": [
            {"role": "user", "content": "Say OK."}]})
        r = response.record
        timings[name] = None if r.end_s is None else round(r.end_s - r.sent_s, 3)
        answered[name] = r.served_model
        if not r.ok:
            failed.append(f"{name} ({_error(response)})")
        elif r.served_model is not None and r.served_model not in names:
            # vLLM names its first served name whatever alias was asked: any of them is fine
            others.append(f"{name} answered as '{r.served_model}'")
    data = {"listed": ids, "seconds": timings, "answered_as": answered}
    if failed or missing or others:
        detail = "; ".join(([f"not listed by /v1/models: {', '.join(missing)}"] if missing
                            else []) + ([f"no answer from {', '.join(failed)}"] if failed else [])
                           + ([f"another model answered: {', '.join(others)}"] if others
                              else []))
        return CheckResult("served names", "fail", detail, "serve every name of "
                           "model.served_names from one engine (`make serve` does)", data)
    return CheckResult("served names", "pass", f"{', '.join(names)} listed and answering",
                       data=data)


def _cache_checks(probe: _Probe, config: dict[str, str]) -> list[CheckResult]:
    """The repeat, the counters and the branch (checks 2-4)."""
    plan = prompt_plan(probe.profile, int_label(config, "block_size"))
    block, count = plan["block"], plan["sentences"]
    system = {"role": "system", "content": f"Self-check {uuid.uuid4().hex}. Answer in one word."}
    first = [system, {"role": "user", "content": _filler(0, count, "Record")}]
    shared = count * 3 // 4
    branch = [system, {"role": "user", "content": _filler(0, shared, "Record") + " " +
                       _filler(shared, count - shared, "Entry")}]
    target = probe.profile.model.target_name
    cold = probe.chat({"model": target, "max_tokens": 1, "messages": first})
    before = probe.counters()
    repeat = probe.chat({"model": target, "max_tokens": 1, "messages": first})
    results = [_repeat_result(cold, repeat, block)]
    results.append(_metrics_result(probe, before, repeat))
    results.append(_branch_result(probe, probe.chat(
        {"model": target, "max_tokens": 1, "messages": branch}), first, branch, plan))
    return results


def _repeat_result(cold: Response, repeat: Response, block: int) -> CheckResult:
    if not cold.record.ok or not repeat.record.ok:
        bad = cold if not cold.record.ok else repeat
        return CheckResult("prefix cache", "fail", f"the cache probe failed: {_error(bad)}",
                           "see the server log")
    prompt, cached = repeat.record.prompt_tokens or 0, repeat.record.cached_tokens
    expected = (max(prompt - 1, 0) // block) * block  # vLLM recomputes the last prompt token
    data = {"prompt_tokens": prompt, "cold_cached_tokens": cold.record.cached_tokens,
            "cached_tokens": cached, "block_size": block, "expected_cached_tokens": expected}
    if cached is None:
        return CheckResult("prefix cache", "fail", "the server reported no cached-token count "
                           "(usage.prompt_tokens_details)", "serve with "
                           "--enable-prompt-tokens-details (`make serve` does)", data)
    if cached == 0:
        return CheckResult("prefix cache", "fail", "prefix cache reported 0 cached tokens on a "
                           f"repeated prompt ({prompt} tokens)", RETENTION_FIX, data)
    if cached % block:
        return CheckResult("prefix cache", "fail", f"{cached} cached tokens is not a whole "
                           f"number of {block}-token blocks", "set engine_args.block_size to "
                           "the block size the server hashes with (vllm:cache_config_info)", data)
    return CheckResult("prefix cache", "pass", f"repeat of a {prompt}-token prompt reported "
                       f"{cached} cached tokens ({cached // block} blocks of {block}; at most "
                       f"{expected} possible)", data=data)


def _metrics_result(probe: _Probe, before: dict[str, float | None],
                    repeat: Response) -> CheckResult:
    cached, prompt = repeat.record.cached_tokens or 0, repeat.record.prompt_tokens or 0
    if before.get("prefix_cache_hits") is None or before.get("prefix_cache_queries") is None:
        return CheckResult("/metrics", "fail", "the server's /metrics has no "
                           "vllm:prefix_cache_hits / vllm:prefix_cache_queries counters",
                           "serve with vLLM and without --disable-log-stats: the bench reads "
                           "its cache figures from them")
    if cached == 0:
        return CheckResult("/metrics", "not run", "nothing to count: the repeat reported 0 "
                           "cached tokens")
    deadline = probe.clock() + METRICS_WAIT_S
    while True:
        after = probe.counters()
        hits = (after.get("prefix_cache_hits") or 0.0) - (before["prefix_cache_hits"] or 0.0)
        queries = ((after.get("prefix_cache_queries") or 0.0)
                   - (before["prefix_cache_queries"] or 0.0))
        # other clients only add to both counters, so ">=" holds on a shared server too
        if (hits >= cached and queries >= prompt) or probe.clock() > deadline:
            break
        time.sleep(0.5)
    data = {"hits_delta": hits, "queries_delta": queries, "request_cached_tokens": cached}
    if hits >= cached and queries >= prompt:
        return CheckResult("/metrics", "pass", f"prefix_cache_hits +{hits:.0f}, "
                           f"prefix_cache_queries +{queries:.0f}", data=data)
    return CheckResult("/metrics", "fail", f"prefix_cache_hits moved by {hits:.0f} and queries "
                       f"by {queries:.0f} in {METRICS_WAIT_S:.0f} s while the request reported "
                       f"{cached} cached of {prompt} prompt tokens", "the bench's cache figures "
                       "come from these counters: check that /metrics is the engine's that "
                       "answered (not a router's or another replica's)", data)


def _branch_result(probe: _Probe, response: Response, first: list[dict[str, str]],
                   branch: list[dict[str, str]], plan: dict[str, int]) -> CheckResult:
    if not response.record.ok:
        return CheckResult("branch", "fail", f"the branch probe failed: {_error(response)}",
                           "see the server log")
    a, b = probe.tokens(first), probe.tokens(branch)
    common = None
    if a is not None and b is not None:
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
    cached = response.record.cached_tokens or 0
    cap = None if common is None else (common // plan["block"]) * plan["block"]
    data = {"shared_tokens": common, "cached_tokens": cached, "cap_tokens": cap,
            "retention_unit": plan["unit"], "prompt_tokens": response.record.prompt_tokens}
    shared = "an unknown number of" if common is None else str(common)
    if cached == 0:
        return CheckResult("branch", "fail", "prefix cache reported 0 cached tokens on a prompt "
                           f"sharing {shared} tokens with an earlier one (a compacted arm's "
                           "case)", RETENTION_FIX, data)
    return CheckResult("branch", "pass", f"a prompt sharing {shared} tokens reported {cached} "
                       f"cached tokens (block-aligned cap {cap if cap is not None else '?'})",
                       data=data)


def _check_reasoning(probe: _Probe) -> CheckResult:
    if probe.profile.model.reasoning != "native":
        return CheckResult("reasoning", "not run", "tagged-visible profile: the reasoning block "
                           "is the visible text")
    response = probe.chat({"model": probe.profile.model.target_name, "max_tokens": 2048,
                           "messages": [{"role": "user", "content": "What is 17 * 19? Think it "
                                         "through, then give only the number."}]})
    r = response.record
    data = {"reasoning_chars": len(response.reasoning), "reasoning_tokens": r.reasoning_tokens,
            "completion_tokens": r.completion_tokens, "finish_reason": r.finish_reason}
    if not r.ok:
        return CheckResult("reasoning", "fail", f"the thinking request failed: {_error(response)}",
                           "see the server log", data)
    if not response.reasoning:
        return CheckResult("reasoning", "fail", "a thinking request returned no reasoning field "
                           f"({r.completion_tokens} tokens, content starts "
                           f"{response.content[:60]!r})", "check engine_args.reasoning_parser "
                           "and that thinking is on (DeepSeek V4: engine_args."
                           "default_chat_template_kwargs)", data)
    return CheckResult("reasoning", "pass", f"{len(response.reasoning)} characters of reasoning "
                       f"({r.reasoning_tokens if r.reasoning_tokens is not None else '?'} "
                       "reasoning tokens reported)", data=data)


def _check_tool(probe: _Probe) -> CheckResult:
    if not probe.profile.model.tool_calls:
        return CheckResult("tool call", "not run", "the agent uses text actions on this profile")
    response = probe.chat({
        "model": probe.profile.model.target_name, "max_tokens": 2048, "tools": [TOOL],
        "tool_choice": "auto", "messages": [
            {"role": "system", "content": "You act only by calling tools."},
            {"role": "user", "content": "What is the weather in Paris now? Call get_weather."}]})
    calls = response.tool_calls
    name = calls[0].get("function", {}).get("name") if calls else None
    arguments = calls[0].get("function", {}).get("arguments") if calls else None
    data = {"calls": len(calls), "name": name, "finish_reason": response.record.finish_reason}
    try:
        parsed = isinstance(json.loads(arguments or ""), dict)
    except ValueError:
        parsed = False
    if response.record.ok and name == "get_weather" and parsed:
        return CheckResult("tool call", "pass", f"parsed call get_weather({arguments})", data=data)
    seen = _error(response) if not response.record.ok else (
        f"{len(calls)} calls, name {name!r}, arguments {arguments!r}" if calls else
        f"no tool call; content starts {response.content[:60]!r}")
    return CheckResult("tool call", "fail", f"a tool request returned no parsed call ({seen})",
                       "check engine_args.tool_call_parser and enable_auto_tool_choice", data)


def run_selfcheck(api_url: str, profile: Profile, *, api_key: str | None = None,
                  command: Sequence[str] | None = None, read_timeout_s: float = 600.0,
                  clock: Clock = monotonic) -> SelfCheckReport:
    """Check the server at `api_url` (with or without /v1) against `profile`; return the report
    or raise `SelfCheckError` (carrying it) when a check fails. `command` is recorded as the
    launcher's effective command line when the suite started the server."""
    started = clock()
    probe = _Probe(api_url, profile, api_key, clock, read_timeout_s)
    try:
        version = probe.server.version()
        config = probe.server.cache_config()
        models = tuple({k: m.get(k) for k in ("id", "root", "max_model_len")}
                       for m in probe.server.models() or [])
        checks = [_check_names(probe)]
        if not checks[0].failed:
            checks += _cache_checks(probe, config)
            checks += [_check_reasoning(probe), _check_tool(probe)]
        checks.append(check_server(probe.profile, version, config, probe.metrics_text()))
    finally:
        probe.close()
    report = SelfCheckReport(
        profile=profile.name, api_url=to_api_url(api_url), server_version=version,
        cache_config=config, models=models, command=tuple(command) if command else None,
        checks=tuple(checks), duration_s=clock() - started)
    if not report.passed:
        raise SelfCheckError(report)
    return report
