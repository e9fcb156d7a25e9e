"""Replay arms: the bench's arms when each continuation is a recorded one (SOURCE=replay).

A replay source is a folder of history files of one fork: `clean.json` and the arms recorded
for it (the study's records as imported into data/histories/study/<record>/: `clean.json` and
`external.json`, the study's rewritten branch; a user's imported trace the same way). A file
without a recorded continuation (an arm file `histories arms` wrote at the fork) is no recorded
arm: that arm runs live over clean's history as below. Block b replays source
`records[(b - 1) % len(records)]`, every arm side by side.

What each arm name replays (loadgen/replay.py has the request-level contract):
- `clean`, `placebo`: clean's history and clean's recorded turns;
- an arm the source recorded (`external`): its own history and recorded turns: the recorded
  behaviour of a model that read the compacted history;
- `external-history`: the external file's compacted history with clean's recorded turns and
  lengths: the history alone changed;
- `self`, `<compressor>-every-<n>`, and `external` where the source recorded none: clean's
  history compacted live by that compressor before every turn (its rewrite time and tokens
  recorded), continued with clean's turns: history only;
- the second paper's policies (`delete-all-thinking`, `keep-latest`, `random-<r>`, the entropy
  arms): clean's history under that policy before every turn, continued with clean's turns:
  history only.

The short first run (`DEFAULT_RECORDS`) replays four records chosen so that a block takes
seconds on two CPU cores and compaction changed each one's history: at most 350 forced output
tokens per branch, both recorded models, and prompts 27-62% shorter after rewriting. The
study's long continuations (one clean branch of DeepSeek V4 Flash decodes 2,627 tokens) are in
RECORDS=all.
"""

from __future__ import annotations

import glob
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_bench.bench.run.arm import Arm, AttemptContext, fork_rewrite_cost
from compaction_bench.bench.run.config import REFERENCE, BenchConfig, BenchError
from compaction_bench.common.paths import histories_root
from compaction_bench.histories.compaction.compactor import CompressorConfig
from compaction_bench.histories.format.history import History, HistoryError, load_history
from compaction_bench.histories.format.recorded import replay_sources
from compaction_bench.histories.policies.base import CleanPolicy, HistoryPolicy
from compaction_bench.histories.policies.compacting import policy_for
from compaction_bench.histories.policies.registry import ArmSpec, parse_arm
from compaction_bench.loadgen.replay import (
    ReplayError,
    ReplayPlan,
    history_only_plan,
    recorded_plan,
)
from compaction_bench.serve.profile import Profile
from compaction_bench.transport.wire import ReplayOptions

DEFAULT_RECORDS = (
    "laguna-s-2.1__atcoder-abc400_b__rep-01__seed-1412000",  # prompt 4,655 -> 1,773 tokens
    "laguna-s-2.1__leetcode-3773__rep-01__seed-1418000",  # 3,101 -> 1,704
    "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000",  # 2,589 -> 1,907
    "laguna-s-2.1__atcoder-abc399_b__rep-01__seed-1410000",  # 2,863 -> 2,130
)
SCORER_MODEL = "embedded:smollm2-135m-instruct"  # tokenizes for the policies' ledgers


@dataclass(frozen=True)
class Recording:
    """One recording a replay run takes in turn, block by block: one fork's history files
    (clean and its recorded branches)."""

    name: str
    folder: Path
    histories: Mapping[str, History]  # by arm: clean, external, ...
    files: Mapping[str, Path]

    @property
    def clean(self) -> History:
        return self.histories[REFERENCE]


def known_sources() -> list[str]:
    return [p.name for p in replay_sources()]


def _folders(names: tuple[str, ...]) -> list[Path]:
    if names == ("all",):
        return replay_sources()
    shipped = histories_root() / "study"
    found: list[Path] = []
    for name in names or DEFAULT_RECORDS:
        candidates = [Path(name), shipped / name]
        folder = next((c for c in candidates if (c / "clean.json").is_file()), None)
        if folder is not None:
            found.append(folder)
            continue
        matches = sorted({Path(p).parent for pattern in (name, str(shipped / name))
                          for p in glob.glob(str(Path(pattern) / "clean.json"))})
        if not matches:
            raise BenchError(f"records: '{name}' is no replay source (a folder holding "
                             f"clean.json); known: {', '.join(known_sources()) or 'none'}, or "
                             "records=all")
        found += matches
    return list(dict.fromkeys(found))


def find_sources(names: tuple[str, ...]) -> list[Recording]:
    """The replay sources RECORDS names (module docstring), each with its history files."""
    sources = []
    for folder in _folders(names):
        files = {p.stem: p for p in sorted(folder.glob("*.json"))}
        try:
            histories = {arm: load_history(path) for arm, path in files.items()}
        except HistoryError as exc:
            raise BenchError(f"replay source {folder}: {exc}") from None
        # an arm file written at the fork (`histories arms`) recorded no continuation: that
        # arm is applied live to clean's history like any policy, not replayed from the file
        histories = {arm: h for arm, h in histories.items()
                     if arm == REFERENCE or _recorded(h)}
        files = {arm: path for arm, path in files.items() if arm in histories}
        sources.append(Recording(folder.name, folder, histories, files))
    return sources


def _recorded(history: History) -> bool:
    """Whether the history holds a recorded continuation (a turn answered after the fork)."""
    return any(m.get("role") == "assistant" for m in history.continuation)


def source_hashes(sources: list[Recording]) -> dict[str, dict[str, Any]]:
    """Every replayed file with its sha256 (fingerprint and manifest)."""
    return {f"{s.name}/{arm}": {"path": str(path),
                                "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
            for s in sources for arm, path in s.files.items()}


def wire_options(profile: Profile) -> ReplayOptions:
    """How recorded turns reach this profile's model: a native reasoning field where it has
    one, else the reasoning as the turn's visible thought (so the compacted history reaches the
    model and shows in its prompt tokens); tool calls and tools where it has them, else text."""
    native = profile.model.reasoning == "native"
    return ReplayOptions(reasoning="keep" if native else "inline",
                         tool_calls="keep" if profile.model.tool_calls else "inline",
                         send_tools=profile.model.tool_calls)


def _plan(spec: ArmSpec, source: Recording) -> ReplayPlan:
    clean = source.clean
    if spec.kind == "reference":
        return recorded_plan(clean, source.name, spec.name)
    if spec.name == "external-history":
        if "external" not in source.histories:
            raise BenchError(f"replay source {source.folder}: external-history needs "
                             "external.json (the compacted history); drop the arm or import it")
        return history_only_plan(source.histories["external"], clean, source.name, spec.name)
    if spec.kind == "recorded" and spec.name not in source.histories:
        raise BenchError(f"replay source {source.folder}: no {spec.name}.json, the agent's own "
                         "compaction: import a log that records one (`compaction-bench "
                         "histories import <log> <folder>/clean.json` writes recorded.json "
                         "beside it), or drop the arm")
    if spec.name in source.histories:  # the source recorded this arm's own continuation
        return recorded_plan(source.histories[spec.name], source.name, spec.name)
    return history_only_plan(clean, clean, source.name, spec.name)


def live_policy(spec: ArmSpec, source: Recording) -> bool:
    """Whether the arm changes clean's history itself (a compressor or a rule), every turn."""
    return spec.kind not in ("reference", "history-only") and spec.name not in source.histories


def replay_arms(config: BenchConfig, sources: list[Recording],
                compressors: Mapping[str, CompressorConfig],
                hooks: Mapping[str, Callable[[], None]]) -> list[Arm]:
    """One `Arm` per name, holding a plan for every source (module docstring)."""
    arms = []
    for name in config.arms:
        spec = parse_arm(name)
        try:
            plans = {s.name: _plan(spec, s) for s in sources}
        except ReplayError as exc:
            raise BenchError(f"{exc}; replay needs histories with per-turn usage") from None
        if spec.compressor and any(live_policy(spec, s) for s in sources) and (
                spec.compressor not in compressors):
            raise BenchError(f"arm '{name}' rewrites live with compressor '{spec.compressor}', "
                             "which is not configured")
        arms.append(Arm(name=name, history=sources[0].clean,
                        new_policy=_policies(spec, sources, compressors, hooks),
                        fork_rewrite=fork_rewrite_cost(sources[0].histories[name])
                        if name in sources[0].histories else {}, replay=plans))
    return arms


def _policies(spec: ArmSpec, sources: list[Recording],
              compressors: Mapping[str, CompressorConfig],
              hooks: Mapping[str, Callable[[], None]]
              ) -> Callable[[AttemptContext], HistoryPolicy]:
    by_name = {s.name: s for s in sources}

    def new_policy(context: AttemptContext) -> HistoryPolicy:
        source = by_name[context.record or sources[0].name]
        if not live_policy(spec, source):
            return CleanPolicy()
        clean = source.clean
        where = {"regime": context.regime, "block": context.block, "attempt": context.attempt,
                 "record": source.name}
        if spec.kind == "compaction":
            assert spec.compressor is not None
            return policy_for(clean, compressors[spec.compressor], name=spec.name,
                              ledger=context.ledger, context=where, on_record=context.on_record,
                              origin_s=context.origin_s, seed=context.seed,
                              before_request=hooks.get(spec.compressor), every=spec.every)
        from compaction_bench.histories.policies.registry import stepwise_policy
        from compaction_bench.histories.policies.scorer import ScorerConfig

        return stepwise_policy(spec, reasoning_mode=clean.reasoning_mode,
                               protocol=clean.action_protocol,
                               scorer=ScorerConfig(model=SCORER_MODEL), seed=context.seed,
                               ledger=context.ledger,
                               context={**where, "task": clean.task, "arm": spec.name,
                                        "phase": "continuation"},
                               origin_s=context.origin_s)

    return new_policy


def compressors_for(config: BenchConfig, sources: list[Recording]) -> set[str]:
    """The compressors some arm rewrites with live (none for the recorded branches)."""
    return {spec.compressor for spec in map(parse_arm, config.arms)
            if spec.compressor and any(live_policy(spec, s) for s in sources)}




@dataclass(frozen=True)
class Fit:
    """Which sources the served model can replay: every turn's served prompt (the server's own
    tokenizer, the chat template applied) plus its forced output within the context."""

    max_model_len: int
    served: dict[str, dict[str, list[int]]]  # source -> arm -> served prompt tokens per turn
    skipped: dict[str, str]  # source -> why it cannot be replayed here
    counted: str  # how the served prompts were counted


def fit_sources(profile: Profile, url: str, recordings: list[Recording], arms: list[Arm],
                wire: ReplayOptions) -> Fit:
    """Tokenize every turn of every arm's plan on the server at `url` (`/tokenize`) and skip
    the recordings with a turn that does not fit the served model's context, each with its
    reason."""
    import os

    from compaction_bench.loadgen.schedule import estimate_tokens, wire_messages
    from compaction_bench.serve.endpoints import EndpointError, ServerEndpoints

    limit = _served_context(url) or profile.engine_args.max_model_len
    served: dict[str, dict[str, list[int]]] = {}
    skipped: dict[str, str] = {}
    counted = "the server's /tokenize"
    with ServerEndpoints(url, api_key=os.environ.get("API_KEY") or None,
                         timeout_s=120.0) as server:
        for source in recordings:
            counts: dict[str, list[int]] = {}
            for arm in arms:
                assert arm.replay is not None
                plan = arm.replay[source.name]
                counts[arm.name] = []
                for turn in plan.turns:
                    messages = wire_messages(list(turn.history), wire)
                    tools = plan.tools if wire.send_tools else None
                    try:
                        prompt = len(server.tokenize_chat(
                            profile.model.target_name, messages, tools)) if counted.startswith(
                            "the server") else estimate_tokens(messages, tools, wire)
                    except EndpointError:
                        # a server without /tokenize (not vLLM): a character estimate, said so
                        counted = f"estimated at {wire.chars_per_token} characters per token"
                        prompt = estimate_tokens(messages, tools, wire)
                    counts[arm.name].append(prompt)
                    if prompt + turn.completion_tokens > limit and source.name not in skipped:
                        skipped[source.name] = (
                            f"{arm.name} turn {turn.number}: {prompt} prompt + "
                            f"{turn.completion_tokens} forced output tokens exceed the served "
                            f"model's {limit}-token context")
            served[source.name] = counts
    return Fit(max_model_len=limit, served=served, skipped=skipped, counted=counted)


def _served_context(url: str) -> int | None:
    """The served model's context length from /v1/models (vLLM reports `max_model_len`)."""
    import os

    from compaction_bench.serve.endpoints import ServerEndpoints

    with ServerEndpoints(url, api_key=os.environ.get("API_KEY") or None,
                         timeout_s=10.0) as server:
        cards = server.models() or []
    return next((int(c["max_model_len"]) for c in cards
                 if isinstance(c.get("max_model_len"), int)), None)


def recorded_figures(sources: list[Recording]) -> dict[str, Any]:
    """Per paired source (clean + external): the recording's own token figures and paired
    changes (histories/format/recorded.py), the study's `pair` for comparison, and where the
    record's reasoning change sits among its model's cases of the study's screens. Kept in the
    manifest, so the report reads them from the run folder alone."""
    from dataclasses import asdict

    from compaction_bench.histories.format.recorded import place, recorded_figures, screen_cases

    cases = screen_cases()
    out: dict[str, Any] = {}
    for source in sources:
        if "external" not in source.histories:
            continue
        figures = recorded_figures(source.clean, source.histories["external"],
                                   name=source.name, origin=str(source.folder))
        placement = place(figures, cases)
        out[source.name] = {
            "model": figures.model, "providers": list(figures.providers),
            "hardware": figures.hardware, "comparable_horizon": figures.comparable_horizon,
            "changes": dict(figures.changes), "recorded_pair": figures.recorded_pair,
            "clean": asdict(figures.clean), "rewritten": asdict(figures.rewritten),
            "placement": {"model": placement.model, "cases": placement.cases,
                          "percentile": placement.percentile, "median": placement.median}}
    return out
