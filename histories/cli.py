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
from compaction_bench.common.net import DEFAULT_PORT
from compaction_bench.common.paths import histories_root, study_root
from compaction_bench.histories.agent.acquisition import acquire
from compaction_bench.histories.agent.audit import audit as render_audit
from compaction_bench.histories.agent.chat import config_for_profile
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.compaction.arms import SEED_ARMS
from compaction_bench.histories.compaction.compactor import (
    IDENTITY_MAX_WORDS,
    CompressorConfig,
    external_compressor,
    self_compressor,
)
from compaction_bench.histories.compaction.endpoint import EndpointConfig
from compaction_bench.histories.compaction.judge import GATES, JudgeConfig, check_gate
from compaction_bench.histories.compaction.lexical import count_words
from compaction_bench.histories.compaction.prompts import REWRITE_PROMPTS
from compaction_bench.histories.format.export import export_minisweagent
from compaction_bench.histories.format.history import (
    History,
    load_history,
    save_history,
    write_json,
)
from compaction_bench.histories.format.importers import import_history, write_study_histories
from compaction_bench.histories.format.reasoning import thought_label
from compaction_bench.histories.policies.armfile import write_arm_files
from compaction_bench.histories.policies.registry import POLICY_ARMS, compressors_needed, parse_arm
from compaction_bench.histories.policies.scorer import scorer_for_profile
from compaction_bench.histories.tasks.task import load_task, runnable_tasks
from compaction_bench.serve.launcher import ServerConfig, server_for
from compaction_bench.serve.profile import (
    EXTERNAL_COMPRESSOR_PROFILE,
    load_profile,
    resolve_profile,
)

app = typer.Typer(help="Agent histories: acquire to a fork, write arms, audit, import, export, "
                  "continue.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)

ProfileOpt = Annotated[str, typer.Option(help="server profile ('auto': for this machine)")]
UrlOpt = Annotated[str | None, typer.Option(
    "--base-url", help="use this OpenAI-compatible server (with or without /v1)")]
# `make histories` writes every arm the bench knows by a fixed name, plus the paper's random-30 and
# a compaction cadence of three turns.
DEFAULT_ARMS = (*SEED_ARMS, *POLICY_ARMS, "self-every-3")
RootOpt = Annotated[Path | None, typer.Option(
    help="history files' root (default: data/histories, or $COMPBENCH_HISTORIES)")]


@app.command("acquire")
def acquire_cmd(
    task: Annotated[str, typer.Option(help="task id, or 'all' for every runnable task")] = "all",
    profile: ProfileOpt = "auto", port: int = DEFAULT_PORT, base_url: UrlOpt = None, seed: int = 0,
    fork_turn: Annotated[int | None, typer.Option(help="override the task's fork turn",
                                                  min=1)] = None,
    out: RootOpt = None,
) -> None:
    """Run the agent to each task's fork and save `<root>/<task>/clean.json`."""
    chosen = resolve_profile(profile)
    root = out or histories_root()
    tasks = [load_task(t) for t in (runnable_tasks() if task == "all" else [task])]
    with server_for(ServerConfig(profile=chosen, port=port), base_url) as url:
        for t in tasks:
            got = acquire(t, config_for_profile(chosen, url, seed), fork_turn=fork_turn,
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
    task: Annotated[str, typer.Option(help="task id, or 'all' for every runnable task")] = "all",
    root: RootOpt = None,
    arms: Annotated[str, typer.Option(
        help="comma-separated arm names (clean and placebo need no file and are skipped)")] = (
        ",".join(DEFAULT_ARMS)),
    profile: Annotated[str, typer.Option(help="the target's profile ('auto')")] = "auto",
    port: int = DEFAULT_PORT,
    base_url: UrlOpt = None,
    external_profile: str = EXTERNAL_COMPRESSOR_PROFILE,
    external_port: int = 8001,
    external_url: Annotated[str | None, typer.Option(
        help="an external compressor's URL (key from $COMPRESSOR_API_KEY)")] = None,
    external_model: str = "compressor",
    prompt: Annotated[str, typer.Option(help=f"one of {', '.join(REWRITE_PROMPTS)}")] = (
        "telegraphic"),
    cap_per_word: Annotated[float | None, typer.Option(
        help="first draft cap = this x raw words + 32 tokens (default: the compressor "
        "profile's compressor_tokens_per_raw_word, 2.0 on the embedded CPU models; for an "
        "--external-url, the study's fixed cap)")] = None,
    judge_url: Annotated[str | None, typer.Option(help="fidelity judge URL")] = None,
    judge_model: str = "judge",
    gate: Annotated[str, typer.Option(help=f"one of {', '.join(GATES)}")] = "off",
    scorer: Annotated[str | None, typer.Option(
        help="the entropy arms' proxy model: a local folder, a cached Hugging Face id or "
        "embedded:<name> (default: the profile's model.scorer; on CPU the served model)")] = None,
    scorer_device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    seed: Annotated[int, typer.Option(help="seed of random-<r> at the fork", min=0)] = 0,
) -> None:
    """Write each arm's file beside each task's clean.json: external.json, self.json and
    <compressor>-every-<n>.json by compaction (ledger and cache in <task>/compaction/), and the
    second paper's entropy.json, step-entropy.json, delete-all-thinking.json, keep-latest.json,
    random-<r>.json by their policies."""
    wanted = [a.strip() for a in arms.split(",") if a.strip()]
    specs = [parse_arm(a) for a in wanted]  # an unknown name fails here, listing the known
    compacting = {s.name: s for s in specs if s.kind == "compaction"}
    stepwise = [s.name for s in specs if s.stepwise]
    if prompt not in REWRITE_PROMPTS:
        raise SuiteError(f"unknown prompt {prompt!r}; use one of {', '.join(REWRITE_PROMPTS)}")
    judge = (JudgeConfig(endpoint=EndpointConfig(api_url=judge_url, model=judge_model))
             if judge_url else None)
    chosen_gate = check_gate(gate, judge)
    base = root or histories_root()
    ids = runnable_tasks() if task == "all" else [task]
    paths = [base / t / "clean.json" for t in ids]
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise SuiteError(f"no clean history at {', '.join(missing)}; acquire first "
                         "(`make histories` or `compaction-bench histories acquire`)")
    target = ServerConfig(profile=resolve_profile(profile), port=port)
    proxy = (scorer_for_profile(target.profile, scorer, device=scorer_device)
             if stepwise else None)
    external = ServerConfig(profile=load_profile(external_profile), port=external_port)
    needed = _needs_compressor(paths) if compacting else False
    used = compressors_needed(list(compacting))
    failed = False
    with _compressor_url("self" in used, needed, target, base_url) as target_url, \
            _compressor_url("external" in used, needed, external, external_url) as ext_url:
        configs: dict[str, CompressorConfig] = {}
        if ext_url is not None:
            per_word = cap_per_word if cap_per_word or external_url else (
                external.profile.model.compressor_tokens_per_raw_word)
            # the rewrite cache's identity names the model that answers where it is known
            # (the embedded compressor); an --external-url's URL stands for its model
            configs["external"] = external_compressor(
                ext_url, model=external_model, prompt=prompt, max_tokens_per_raw_word=per_word,
                cache_tag="" if external_url else external.profile.model.source)
        if target_url is not None:
            configs["self"] = self_compressor(
                target_url, model=target.profile.model.compressor_name, prompt=prompt,
                max_tokens_per_raw_word=(
                    cap_per_word or target.profile.model.compressor_tokens_per_raw_word),
                cache_tag=target.profile.model.source)
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
def audit_cmd(path: Path, profile: ProfileOpt = "auto", port: int = DEFAULT_PORT,
              base_url: UrlOpt = None, model: str = "target",
              json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Render two consecutive requests of a history through the server's /tokenize."""
    history = load_history(path)
    with server_for(ServerConfig(profile=resolve_profile(profile), port=port), base_url) as url:
        result = render_audit(history, url, model=model, api_key=os.environ.get("API_KEY"))
    typer.echo(json.dumps(result.to_json(), indent=2) if json_out else result.summary())


# The arms an imported history can have without any model server: the second paper's policies
# that only need a tokenizer for their ledgers (the embedded one, on the CPU).
MODEL_FREE_ARMS = ("delete-all-thinking", "keep-latest", "random-30")
TOKENIZER = "embedded:smollm2-135m-instruct"


def next_commands(history: History, out: Path) -> list[str]:
    """What to run after importing `history` to `out`: the fork chosen and why, the arm files
    it can have without a model, and the replay when it carries recorded per-turn usage."""
    lines = [f"fork: message {history.fork.message_index if history.fork else None}: "
             f"{history.provenance.get('fork_choice', 'marked in the file')}"]
    if history.fork is None or history.fork.pending_result is None:
        lines.append("no arm files: the fork's result was not recorded; import again with "
                     "--fork N at an action whose result was")
    elif out.name != "clean.json" or history.arm != "clean":
        lines.append("arm files are written beside a clean arm's clean.json: import to "
                     f"{out.parent / history.task / 'clean.json'} to write them")
    else:
        lines += ["write the arm files that need no model:",
                  f"  compaction-bench histories arms --root {out.parent.parent} --task "
                  f"{out.parent.name} --arms {','.join(MODEL_FREE_ARMS)} --scorer {TOKENIZER} "
                  "--scorer-device cpu"]
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
    source: Path,
    out: Annotated[Path | None, typer.Argument(
        help="the history file to write (default: <histories root>/imported/<task>/clean.json)")]
    = None,
    task: str | None = None,
    fork: Annotated[int | None, typer.Option(
        help="the fork: an index into all messages of the file, counted from 0 (default: the "
        "last action whose result was recorded)")] = None,
) -> None:
    """Import an agent's log (mini-swe-agent, SWE-agent, OpenHands, Claude Code, Codex CLI, a
    request/response log, OpenAI messages, a study record), say which fork it chose and why,
    and print the commands to run next."""
    history = import_history(source, task=task, fork=fork)
    target = out or histories_root() / "imported" / history.task / "clean.json"
    save_history(history, target)
    typer.echo(f"wrote {target}")
    for line in next_commands(history, target):
        typer.echo(line)


@app.command("import-study")
def import_study_cmd(
    src: Annotated[Path | None, typer.Argument(help="folder of *__rep-*.json study records")]
    = None,
    out: RootOpt = None,
) -> None:
    """Convert every study record into <out>/study/<record>/{clean,external}.json."""
    for path in write_study_histories(src or study_root() / "records",
                                      (out or histories_root()) / "study"):
        typer.echo(str(path))


@app.command("export")
def export_cmd(path: Path, out: Path) -> None:
    """Export a history as a mini-swe-agent trajectory (opens in mini-swe-agent's inspector)."""
    write_json(out, export_minisweagent(load_history(path)))
    typer.echo(f"wrote {out}")


@app.command("continue")
def continue_cmd(path: Path, profile: ProfileOpt = "auto", port: int = DEFAULT_PORT,
                 base_url: UrlOpt = None, seed: int = 0,
                 step_limit: Annotated[int | None, typer.Option(min=1)] = None) -> None:
    """Continue a saved history from its fork to a terminal status; print the timing."""
    history = load_history(path)
    chosen = resolve_profile(profile)
    with server_for(ServerConfig(profile=chosen, port=port), base_url) as url:
        result = continue_history(history, load_task(history.task),
                                  config_for_profile(chosen, url, seed), step_limit=step_limit)
    typer.echo(json.dumps({
        "task": result.task, "arm": result.arm, "terminal_status": result.terminal_status,
        "turns": result.turns, "setup_s": result.setup_s, "postfork_s": result.postfork_s,
        "validation_passed": result.validation.passed if result.validation else None,
        "requests": len(result.requests), "error": result.error}, indent=2))

