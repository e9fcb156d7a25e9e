"""The report's replay sections (bench/analysis/replay.py): what was replayed and measured, the
split of a recorded arm's change into history and continuation, the forced lengths, the
recorded-versus-served prompts, the study's own recorded figures and where the replayed records
sit among all of its cases."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_bench.bench.analysis.paired import POOLED
from compaction_bench.bench.analysis.replay import ReplayAnalysis, Split
from compaction_bench.bench.analysis.stats import MIN_BLOCKS_FOR_MEDIAN_INTERVAL
from compaction_bench.bench.report.changes import interval_text, median_text
from compaction_bench.bench.report.document import Bullets, Paragraph, Section, Table
from compaction_bench.common.markdown import percent


def _pct(value: float | None) -> str:
    return percent(value, 1, sign=True)


def _ci(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return f"no interval (n < {MIN_BLOCKS_FOR_MEDIAN_INTERVAL})"
    return f"[{low:+.1f}, {high:+.1f}]"


def _split_row(split: Split) -> tuple[str, ...]:
    ci = split.continuation_ci_pct
    return (split.regime if split.regime != POOLED else "pooled", split.arm, str(split.n),
            f"{median_text(split.total, 1)} "
            f"{interval_text(split.total) or _ci(None, None)}",
            f"{median_text(split.history, 1)} "
            f"{interval_text(split.history) or _ci(None, None)}",
            f"{_pct(split.continuation_median_pct)} "
            f"{_ci(ci[0], ci[1]) if ci else _cut(split) or _ci(None, None)}")


def _cut(split: Split) -> str | None:
    """Why the continuation part has no interval though the blocks are enough, if so."""
    cut = max(split.total.n_censored, split.history.n_censored)
    return (f"no interval ({cut} block(s) cut at the wall limit: this part's bound has no "
            "known direction)" if cut and split.n >= MIN_BLOCKS_FOR_MEDIAN_INTERVAL else None)


def replay_sections(replay: ReplayAnalysis, arms: Sequence[str]) -> list[Section]:
    """The sections of a replay run's report (none for live agents)."""
    models = sorted({f"{r.model} ({r.recorded_by})" if r.recorded_by else str(r.model)
                     for r in replay.sources})
    total = replay.forced_total
    what = Section("What was replayed, and whose time was measured").add(Bullets((
        "tokens replayed: recorded reasoning-model continuations of the source study "
        f"({', '.join(models)}): each postfork turn re-sent with its recorded messages and its "
        "output forced to its recorded length (max_tokens = min_tokens = recorded completion "
        "tokens, ignore_eos); tool results as recorded, tool time "
        f"{'as recorded (none recorded: 0 s)' if replay.tool_time == 'recorded' else 'none'}",
        f"time measured: {replay.measured_on}; the recorded wall times are not used",
        "forced outputs at exactly their recorded length: "
        f"{total.exact}/{total.requests}"
        + (f" ({100 * total.share:.1f}%)" if total.share is not None else "")
        + "; " + ", ".join(f"{f.arm} {f.exact}/{f.requests}" for f in replay.forced),
        "what each arm carries: " + ", ".join(
            f"{arm}: {replay.continuation.get(arm, 'recorded')}"
            + (" behaviour" if replay.continuation.get(arm, 'recorded') == "recorded"
               else " (its history changed; clean's recorded turns)") for arm in arms),
        *(f"{arm}: identical to clean: nothing was compacted (its first request equals "
          "clean's, so its change is noise)" for arm in replay.identical),
        *(f"{row.source}: {row.freeform_tool_calls} freeform (custom) tool call(s) sent as "
          "function calls with {\"input\": <the recorded text>}, not in their recorded shape: "
          "vLLM's chat completions take function tool calls only, so those prompt tokens are "
          "the text as a JSON string" for row in replay.sources if row.freeform_tool_calls),
    )))
    sections = [what]
    if replay.splits:
        sections.append(Section("Where the change comes from: history and continuation").add(
            Paragraph("Paired change of postfork time against clean, median over complete "
                      "blocks with its 95% order-statistic interval. history: the compacted "
                      "history continued with clean's recorded turns and lengths; "
                      "continuation: 100 (arm - history-only twin) / clean per block, what the "
                      "changed reasoning after the fork adds. Medians of per-block values: the "
                      "parts need not add up to the total. " + (
                          "The arms of each block ran side by side and shared the engine's "
                          "batches, so clean's longer prefill also slowed its neighbours: the "
                          "history part here understates a shorter history's saving (SIDE_BY_"
                          "SIDE=0 runs them one after another)." if replay.side_by_side else
                          "The arms of each block ran one after another in its random order, "
                          "each alone beside the regime's load, so each arm's time holds its "
                          "own prefill and decode.")),
            Table(("Regime", "Arm", "Blocks", "total [95% CI]", "history [95% CI]",
                   "continuation [95% CI]"), tuple(_split_row(s) for s in replay.splits
                                                   if s.regime != POOLED or len({
                                                       x.regime for x in replay.splits}) > 2))))
    prompts = Table(
        ("Record", "Recorded model", "Blocks", *(f"{a}: recorded / served prompt" for a in arms)),
        tuple((row.source, str(row.model), str(row.blocks),
               *(f"{row.recorded_prompt.get(a) or '-'} / {row.served_prompt.get(a) or '-'}"
                 for a in arms)) for row in replay.sources),
        caption="First postfork request: prompt tokens as the recording's server counted them "
        "and as this server's tokenizer renders them (different tokenizers and templates).")
    sections.append(Section("Replayed records").add(prompts))
    if replay.recorded:
        sections[-1].add(_recorded_table(replay))
    if replay.skipped:
        sections[-1].add(Bullets(tuple(f"skipped {name}: {why}"
                                       for name, why in sorted(replay.skipped.items()))))
    return sections


PAIR_COLUMNS = (("reasoning_token_change_percent", "reasoning"),
                ("completion_token_change_percent", "completion"),
                ("prompt_token_change_percent", "prompt"))


def _pair_cell(computed: object, published: object) -> str:
    if not isinstance(computed, int | float):
        return "not comparable"
    shown = f"{computed:+.2f}%"
    if isinstance(published, int | float):
        return shown + (" (= study)" if abs(computed - published) < 0.005
                        else f" (study {published:+.2f}%)")
    return shown


def _recorded_table(replay: ReplayAnalysis) -> Table:
    rows = []
    for name, entry in sorted(replay.recorded.items()):
        changes = entry.get("changes") or {}
        pair = entry.get("recorded_pair") or {}
        place = entry.get("placement") or {}
        where = ("-" if place.get("percentile") is None else
                 f"percentile {place['percentile']:.0f} of {place.get('cases')} "
                 f"{place.get('model')} cases (their median {place.get('median'):+.1f}%)")
        rows.append((name, *(_pair_cell(changes.get(key), pair.get(key))
                             for key, _ in PAIR_COLUMNS), where))
    return Table(("Record", *(f"{label} tokens, recorded change" for _, label in PAIR_COLUMNS),
                  "reasoning change among the study's screens"), tuple(rows),
                 caption="The recording's own paired changes (rewritten vs clean branch, summed "
                 "over the postfork turns), recomputed from the shipped histories and checked "
                 "against the study's published `pair` figures; the last column places the "
                 "record among its model's 108-case screens (data/study/screens.json).")
