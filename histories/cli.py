"""`compaction-bench histories`: acquire, write compaction arms, audit, import, export and
continue agent histories. Each command parses, calls one library function and prints what it
wrote."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from compaction_bench.common.errors import ExitCode, SuiteError
from compaction_bench.common.options import (
    ConfigFile,
    FromEnv,
    ShowSettings,
    alias,
    settings_from,
    show_settings,
    split_words,
    words_help,
)
from compaction_bench.common.paths import histories_root, study_root
from compaction_bench.histories.agent.acquisition import acquire
from compaction_bench.histories.agent.audit import audit as render_audit
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.compaction.compactor import (
    IDENTITY_MAX_WORDS,
    CompressorConfig,
    external_compressor,
    profile_compressor,
)
from compaction_bench.histories.compaction.endpoint import EndpointConfig
from compaction_bench.histories.compaction.judge import JudgeConfig, check_gate
from compaction_bench.histories.compaction.lexical import count_words
from compaction_bench.histories.format.export import export_minisweagent
from compaction_bench.histories.format.history import (
    History,
    load_history,
    save_history,
    write_json,
)
from compaction_bench.histories.format.importers import import_history, write_study_histories
from compaction_bench.histories.format.reasoning import thought_label
from compaction_bench.histories.policies.armfile import rehearse, write_arm_files
from compaction_bench.histories.policies.registry import compressors_needed, parse_arm
from compaction_bench.histories.policies.scorer import scorer_for_profile
from compaction_bench.histories.settings import (
    AcquireConfig,
    ArmsConfig,
    AuditConfig,
    ContinueConfig,
    ImportConfig,
    ImportStudyConfig,
)
from compaction_bench.histories.tasks.task import load_task, runnable_tasks
from compaction_bench.serve.launcher import ServerConfig, server_for
from compaction_bench.serve.profile import (
    load_profile,
    resolve_profile,
)

app = typer.Typer(help="Agent histories: acquire to a fork, write arms, audit, import, export, "
                  "continue.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)

@app.command("acquire")
def acquire_cmd(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("task=fix-median seed=3"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    task: Annotated[str | None, alias("task")] = None,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
    fork_turn: Annotated[int | None, alias("fork_turn")] = None,
    out: Annotated[Path | None, alias("out")] = None,
) -> None:
    """Run the agent to each task's fork and save `<root>/<task>/clean.json`."""
    if show:
        show_settings(AcquireConfig)
        return
    c = settings_from(AcquireConfig, "histories acquire", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    chosen = resolve_profile(c.profile)
    root = c.out or histories_root()
    tasks = [load_task(t) for t in (runnable_tasks() if c.task == "all" else [c.task])]
    with server_for(ServerConfig(profile=chosen, port=c.port), c.base_url) as url:
        for t in tasks:
            got = acquire(t, config_for_profile(chosen, url, c.seed), fork_turn=c.fork_turn,
                          provenance={"profile": chosen.name})
            path = root / t.id / "clean.json"
            save_history(got.history, path)
            fork = got.history.fork.message_index if got.history.fork else None
            typer.echo(f"{path}: fork at message {fork} after {len(got.requests)} requests")


@contextlib.contextmanager
def _compressor_url(wanted: bool, needed: bool, config: ServerConfig,
                    url: str | None) -> Iterator[str | None]:
    """The api_url of a compressor's server: None when its arm is not wanted; the URL it would
    have, without starting it, when no block needs a compressor (every block of at most 12
    words stays identical, so on cpu-tiny no request is ever sent)."""
    if not wanted:
        yield None
    elif not needed:
        yield url or config.api_url
    else:
        with server_for(config, url) as got:
            yield got


def _needs_compressor(paths: list[Path]) -> bool:
    for path in paths:
        for _, block in load_history(path).reasoning_blocks():
            if count_words(thought_label(block)[1]) > IDENTITY_MAX_WORDS:
                return True
    return False


@app.command("arms")
def arms_cmd(
    ctx: typer.Context,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("arms=self,external task=fix-median"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    task: Annotated[str | None, alias("task")] = None,
    root: Annotated[Path | None, alias("root")] = None,
    arms: Annotated[str | None, alias("arms")] = None,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    external_profile: Annotated[str | None, alias("external_profile")] = None,
    external_port: Annotated[int | None, alias("external_port")] = None,
    external_url: Annotated[str | None, alias("external_url")] = None,
    external_model: Annotated[str | None, alias("external_model")] = None,
    prompt: Annotated[str | None, alias("prompt")] = None,
    cap_per_word: Annotated[float | None, alias("cap_per_word")] = None,
    judge_url: Annotated[str | None, alias("judge_url")] = None,
    judge_model: Annotated[str | None, alias("judge_model")] = None,
    gate: Annotated[str | None, alias("gate")] = None,
    scorer: Annotated[str | None, alias("scorer")] = None,
    scorer_device: Annotated[str | None, alias("scorer_device")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
) -> None:
    """Write each arm's file beside each task's clean.json: external.json, self.json and
    <compressor>-every-<n>.json by compaction (ledger and cache in <task>/compaction/), and the
    second paper's entropy.json, step-entropy.json, delete-all-thinking.json, keep-latest.json,
    random-<r>.json by their policies."""
    if show:
        show_settings(ArmsConfig)
        return
    c = settings_from(ArmsConfig, "histories arms", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    task, root, profile, port, base_url = c.task, c.root, c.profile, c.port, c.base_url
    external_url, cap_per_word, seed = c.external_url, c.cap_per_word, c.seed
    specs = [parse_arm(a) for a in c.arms]  # an unknown name fails here, listing the known
    compacting = {s.name: s for s in specs if s.kind == "compaction"}
    stepwise = [s.name for s in specs if s.stepwise]
    judge = (JudgeConfig(endpoint=EndpointConfig(api_url=c.judge_url, model=c.judge_model))
             if c.judge_url else None)
    chosen_gate = check_gate(c.gate, judge)
    base = root or histories_root()
    ids = runnable_tasks() if task == "all" else [task]
    paths = [base / t / "clean.json" for t in ids]
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise SuiteError(f"no clean history at {', '.join(missing)}; acquire first "
                         "(`make histories` or `compaction-bench histories acquire`)")
    target = ServerConfig(profile=resolve_profile(profile), port=port)
    proxy = (scorer_for_profile(target.profile, c.scorer, device=c.scorer_device)
             if stepwise else None)
    external = ServerConfig(profile=load_profile(c.external_profile), port=c.external_port)
    needed = _needs_compressor(paths) if compacting else False
    used = compressors_needed(list(compacting))
    failed = False
    with _compressor_url("self" in used, needed, target, base_url) as target_url, \
            _compressor_url("external" in used, needed, external, external_url) as ext_url:
        configs: dict[str, CompressorConfig] = {}
        if ext_url is not None and external_url:
            # an external_url names no model: its URL stands for it in the rewrite cache's
            # identity, and its cap is the study's fixed one unless cap_per_word is given
            configs["external"] = external_compressor(
                ext_url, model=c.external_model, prompt=c.prompt,
                max_tokens_per_raw_word=cap_per_word)
        elif ext_url is not None:
            configs["external"] = profile_compressor("external", ext_url, external.profile,
                                                     prompt=c.prompt, per_word=cap_per_word)
        if target_url is not None:
            configs["self"] = profile_compressor("self", target_url, target.profile,
                                                 prompt=c.prompt, per_word=cap_per_word)
        for path in paths:
            for r in write_arm_files(path, [*compacting, *stepwise], compressors=configs,
                                     scorer=proxy, judge=judge, gate=chosen_gate, seed=seed):
                failed |= not r.written
                status = "written" if r.written else "NOT written"
                typer.echo(f"{r.path}: {status}; " + json.dumps(
                    {k: v for k, v in r.totals.items() if k in _SHOWN}))
                for problem in r.problems:
                    typer.echo(f"  problem: {problem}", err=True)
    if failed:
        raise typer.Exit(ExitCode.FAILED)


_SHOWN = ("blocks", "rewritten", "identity-short", "reverted-not-shorter", "failed", "words_in",
          "words_out", "latency_s", "cache_hits", "live_latency_s", "steps", "pruned",
          "single-segment", "skipped-scorer-limit", "deleted", "tokens-removed", "scorer_s",
          "scorer_tokens")


@app.command("audit")
def audit_cmd(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(help="the history file")] = None,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("port=8100 json_out=1"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    model: Annotated[str | None, alias("model")] = None,
    json_out: Annotated[bool | None, alias("json_out", "--json")] = None,
) -> None:
    """Render two consecutive requests of a history through the server's /tokenize."""
    if show:
        show_settings(AuditConfig)
        return
    c = settings_from(AuditConfig, "histories audit", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    history = load_history(_given(path, "PATH", "histories audit <history.json>"))
    with server_for(ServerConfig(profile=resolve_profile(c.profile), port=c.port),
                    c.base_url) as url:
        result = render_audit(history, url, model=c.model, api_key=os.environ.get("API_KEY"))
    typer.echo(json.dumps(result.to_json(), indent=2) if c.json_out else result.summary())


def _given(path: Path | None, hint: str, usage: str) -> Path:
    if path is None:
        raise typer.BadParameter(f"give the file: compaction-bench {usage}", param_hint=hint)
    return path


# The arms an imported history can have without any model server: the second paper's policies
# that only need a tokenizer for their ledgers (the embedded one, on the CPU).
MODEL_FREE_ARMS = ("delete-all-thinking", "keep-latest", "random-30")
TOKENIZER = "embedded:smollm2-135m-instruct"


def default_target(history: History, root: Path | None = None) -> Path:
    """Where an import goes unless told: `<root>/<task>/clean.json` (root: the histories root's
    `imported/`), unless that folder holds another log's import, when the source file's hash
    names the folder (`<task>-<sha256[:8]>`): two runs of one instance never overwrite each
    other."""
    folder = (root or histories_root() / "imported") / history.task
    digest = str((history.source or {}).get("sha256") or "")
    existing = folder / "clean.json"
    if digest and existing.is_file():
        try:
            same = (load_history(existing).source or {}).get("sha256") == digest
        except SuiteError:
            same = False
        if not same:
            folder = folder.with_name(f"{history.task}-{digest[:8]}")
    return folder / "clean.json"


def next_commands(history: History, out: Path) -> list[str]:
    """What to run after importing `history` to `out`: the fork chosen and why, the arm files
    it can have without a model, and the replay when it carries recorded per-turn usage."""
    lines = [f"fork: message {history.fork.message_index if history.fork else None}: "
             f"{history.provenance.get('fork_choice', 'marked in the file')}"]
    if history.fork is None or history.fork.pending_result is None:
        lines.append("no arm files: the fork's result was not recorded; import again with "
                     "fork=N at an action whose result was")
    elif out.name != "clean.json" or history.arm != "clean":
        lines.append("arm files are written beside a clean arm's clean.json: import to "
                     f"{default_target(history, out.parent)} to write them")
    else:
        lines += ["write the arm files that need no model:",
                  f"  compaction-bench histories arms root={out.parent.parent} task="
                  f"{out.parent.name} arms={','.join(MODEL_FREE_ARMS)} scorer={TOKENIZER} "
                  "scorer_device=cpu"]
    turns = [m for m in history.continuation if m.get("role") == "assistant"]
    if turns and all(_completion_tokens(m) > 0 for m in turns) and out.name == "clean.json":
        lines += [f"replay its {len(turns)} recorded turn(s) at their recorded lengths, clean "
                  "against the policies applied live to its history (add self to compact it "
                  "with the served model):",
                  f"  compaction-bench bench source=replay records={out.parent} "
                  f"arms=clean,{','.join(MODEL_FREE_ARMS)}"]
    return lines


def _completion_tokens(message: dict[str, object]) -> int:
    extra = message.get("extra")
    usage = extra.get("usage") if isinstance(extra, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    source: Annotated[Path | None, typer.Argument(help="the agent's log")] = None,
    rest: Annotated[list[str] | None, typer.Argument(
        help="the history file to write (default: <histories root>/imported/<task>/"
        "clean.json), then any settings as name=value (fork=4 task=fix-median)",
        show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    task: Annotated[str | None, alias("task")] = None,
    fork: Annotated[int | None, alias("fork")] = None,
) -> None:
    """Import an agent's log (mini-swe-agent, SWE-agent, OpenHands, Claude Code, Codex CLI, a
    request/response log, OpenAI messages, a study record), say which fork it chose and why,
    and print the commands to run next."""
    if show:
        show_settings(ImportConfig)
        return
    paths, words = split_words(rest)
    if len(paths) > 1:
        raise typer.BadParameter(f"one output file, got {len(paths)}: {', '.join(paths)}",
                                 param_hint="OUT")
    c = settings_from(ImportConfig, "histories import", words=words, file=config_file,
                      from_env=from_env, flags=ctx.params)
    log = _given(source, "SOURCE", "histories import <log> [out.json]")
    history = import_history(log, task=c.task, fork=c.fork)
    if history.arm == "clean" and history.fork and history.fork.pending_result is not None:
        rehearse(history, str(log))  # never accept what the printed arms command refuses
    target = Path(paths[0]) if paths else default_target(history)
    save_history(history, target)
    typer.echo(f"wrote {target}")
    pair = history.provenance.get("recorded_pair")
    boundary = (history.provenance.get("compactions") or [{}])[-1]
    if isinstance(pair, dict) and target.name == "clean.json" and "unreadable" in boundary:
        typer.echo(f"no recorded.json: the agent's own compaction at line {boundary['line']} "
                   f"cannot be a recorded arm ({boundary['unreadable']})")
    elif isinstance(pair, dict) and target.name == "clean.json":
        # the agent's own compaction: its summary and the turns after it, beside the clean arm
        recorded = import_history(log, task=c.task, fork=c.fork, arm="recorded")
        save_history(recorded, target.parent / "recorded.json")
        typer.echo(f"wrote {target.parent / 'recorded.json'}: the agent's own compaction "
                   f"({boundary['trigger']}, {boundary['tokens_before']} tokens before, line "
                   f"{boundary['line']}): its summary in place of the "
                   f"{pair['clean_messages_before_the_boundary']} messages clean.json keeps "
                   f"(clean's context: {pair['clean_context']})")
    typer.echo(reasoning_line(history))
    freeform = history.provenance.get("freeform_tool_calls")
    if isinstance(freeform, dict):
        typer.echo(f"note: {freeform['count']} freeform (custom) tool call(s) held as "
                   f"{freeform['held_as']}")
    for line in next_commands(history, target):
        typer.echo(line)


def reasoning_line(history: History) -> str:
    """What reasoning the import read, what it could not, and what the policies will treat as
    the reasoning: where no block is readable, the visible text before each action, which a
    reasoning policy then edits."""
    turns = [m for m in history.messages + history.continuation if m.get("role") == "assistant"]
    readable = sum(bool(m.get("reasoning")) for m in turns)
    p = history.provenance
    hidden = {"encrypted": p.get("encrypted_reasoning_items"),
              "redacted": p.get("redacted_thinking_blocks")}
    unreadable = ", ".join(f"{n} {kind}" for kind, n in hidden.items()
                           if isinstance(n, int) and n)
    uses = ("the reasoning field (native)" if history.reasoning_mode == "native" else
            "the visible text before each action (no readable reasoning field"
            + (": a reasoning policy edits what the user saw" if unreadable else "") + ")")
    return (f"reasoning: {readable} of {len(turns)} assistant turns readable"
            + (f" ({unreadable}, not readable)" if unreadable else "")
            + f"; the policies use {uses}")


@app.command("import-study", hidden=True)
def import_study_cmd(
    ctx: typer.Context,
    src: Annotated[Path | None, typer.Argument(help="folder of *__rep-*.json study records")]
    = None,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("out=/tmp/histories"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    out: Annotated[Path | None, alias("out")] = None,
) -> None:
    """Convert every study record into <out>/study/<record>/{clean,external}.json."""
    if show:
        show_settings(ImportStudyConfig)
        return
    c = settings_from(ImportStudyConfig, "study import", words=settings,
                      file=config_file, from_env=from_env, flags=ctx.params)
    for path in write_study_histories(src or study_root() / "records",
                                      (c.out or histories_root()) / "study"):
        typer.echo(str(path))


# `histories import-study` is now `compaction-bench study import` (compaction_bench/cli.py,
# GROUPED): the old spelling stays, hidden, until 0.2.0 and says which to use.
for _info in app.registered_commands:
    if _info.name == "import-study":
        # typer types it bool; the click it vendors prints a message given instead
        _info.deprecated = ("Use `compaction-bench study import`; "  # type: ignore[assignment]
                            "`histories import-study` goes in 0.2.0.")


@app.command("export")
def export_cmd(path: Path, out: Path) -> None:
    """Export a history as a mini-swe-agent trajectory (opens in mini-swe-agent's inspector)."""
    write_json(out, export_minisweagent(load_history(path)))
    typer.echo(f"wrote {out}")


@app.command("continue")
def continue_cmd(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(help="the history file")] = None,
    settings: Annotated[list[str] | None, typer.Argument(
        help=words_help("port=8100 step_limit=3"), show_default=False)] = None,
    config_file: ConfigFile = None,
    from_env: FromEnv = False,
    show: ShowSettings = False,
    profile: Annotated[str | None, alias("profile")] = None,
    port: Annotated[int | None, alias("port")] = None,
    base_url: Annotated[str | None, alias("base_url")] = None,
    seed: Annotated[int | None, alias("seed")] = None,
    step_limit: Annotated[int | None, alias("step_limit")] = None,
) -> None:
    """Continue a saved history from its fork to a terminal status; print the timing."""
    if show:
        show_settings(ContinueConfig)
        return
    c = settings_from(ContinueConfig, "histories continue", words=settings, file=config_file,
                      from_env=from_env, flags=ctx.params)
    history = load_history(_given(path, "PATH", "histories continue <history.json>"))
    chosen = resolve_profile(c.profile)
    with server_for(ServerConfig(profile=chosen, port=c.port), c.base_url) as url:
        result = continue_history(history, load_task(history.task),
                                  config_for_profile(chosen, url, c.seed),
                                  step_limit=c.step_limit)
    typer.echo(json.dumps({
        "task": result.task, "arm": result.arm, "terminal_status": result.terminal_status,
        "turns": result.turns, "setup_s": result.setup_s, "postfork_s": result.postfork_s,
        "validation_passed": result.validation.passed if result.validation else None,
        "requests": len(result.requests), "error": result.error}, indent=2))

