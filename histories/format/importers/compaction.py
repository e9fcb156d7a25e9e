"""The agent's own compaction, as a harness's log records it (Claude Code's `compact_boundary`,
Codex's `compacted`): from the boundary on, the model saw the compaction's replacement (a summary,
or the items the harness kept), not the turns before it. An importer splits its messages at each
boundary (`segments`: the messages before each; `after`: those after the last) and this module
makes the **recorded pair** of the last boundary, forked at the first action after it:

- `clean`: the model's context as it stood at the boundary (from the log's start, or from the
  previous compaction's replacement), then the turns after the boundary: compaction undone;
- `recorded` (`arm=recorded`): the replacement, then the same turns: what the model really saw.

A replacement is never imported as a turn after the turns it replaced. A replacement that cannot
be read (Codex encrypts its summary) gives no recorded arm, and cannot start a clean context
either: both are refused in one line saying so.
"""

from __future__ import annotations

from typing import Any

from compaction_bench.histories.format.history import message_action, refusal
from compaction_bench.histories.format.importers.normalize import detect_modes, normalize_message

RECORDED_ARM = "recorded"  # the agent's own compaction, as its log recorded it


def recorded_pair(segments: list[list[dict[str, Any]]], after: list[dict[str, Any]],
                  compactions: list[dict[str, Any]], arm: str, fork: int | None, origin: str,
                  provenance: dict[str, Any], *, boundary: str) -> tuple[
                      list[dict[str, Any]], int | None]:
    """The messages of `arm` and its fork (see the module docstring); `compactions` are the
    boundaries, each with `line`, `trigger`, `tokens_before` and either `replacement` (the
    messages the model saw instead) or `unreadable` (why not). Without a compaction the log is
    returned as it is; `recorded` is then refused. What was found goes into `provenance`."""
    if not compactions:
        if arm == RECORDED_ARM:
            raise refusal(origin, f"arm 'recorded' is the agent's own compaction, and this log "
                          f"records none (no {boundary} record): import it as clean",
                          field_name="arm")
        return [m for segment in segments for m in segment] + after, fork
    last = compactions[-1]
    if arm not in ("clean", RECORDED_ARM):
        raise refusal(origin, f"a log with the agent's own compaction has arms clean and "
                      f"recorded, not {arm!r}", field_name="arm")
    if fork is not None:
        raise refusal(origin, f"this log records the agent's own compaction at line "
                      f"{last['line']}; its pair forks at the first action after it, so fork= "
                      "does not apply: drop it", field_name="fork")
    provenance["compactions"] = [{k: v for k, v in c.items() if k != "replacement"}
                                 for c in compactions]
    if arm == RECORDED_ARM and "replacement" not in last:
        raise refusal(origin, f"the compaction at line {last['line']} cannot be a recorded arm: "
                      f"{last['unreadable']}; import it as clean (the compaction undone)",
                      field_name="arm")
    start: list[dict[str, Any]] = []
    if len(compactions) > 1:
        previous = compactions[-2]
        if "replacement" not in previous:
            raise refusal(origin, f"the model's context at the compaction at line "
                          f"{last['line']} began with the compaction at line "
                          f"{previous['line']}, which cannot be read ({previous['unreadable']}); "
                          f"import the log cut before line {last['line']} instead",
                          index=f"line {previous['line']}")
        start = list(previous["replacement"])
    context = [*start, *segments[-1]]
    protocol = detect_modes([normalize_message(m) for m in [*context, *after]])[1]
    actions = [i for i, m in enumerate(after)
               if message_action(normalize_message(m), protocol) is not None]
    if not actions:
        raise refusal(origin, f"no action after the compaction at line {last['line']} to fork "
                      "at: the pair needs the turn the agent took next", field_name="fork")
    provenance["recorded_pair"] = {
        "boundary_line": last["line"], "arm": arm,
        "clean_context": (("the log's first message" + (
            " (the log starts mid-session: the context held more before it)"
            if provenance.get("starts_mid_session") else ""))
            if len(compactions) == 1 else
            f"the replacement of the compaction at line {compactions[-2]['line']}"),
        "messages_before_the_context": sum(len(segment) for segment in segments[:-1]),
        "clean_messages_before_the_boundary": len(context),
        "recorded": ("the agent's replacement in their place" if "replacement" in last
                     else f"none: {last['unreadable']}")}
    prefix = context if arm == "clean" else list(last["replacement"])
    return [*prefix, *after], len(prefix) + actions[0]
