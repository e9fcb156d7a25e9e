"""History policies: given the messages before a request, return the messages to send.

An arm is a policy. `clean` sends the history as it is; compaction policies rewrite reasoning
blocks (and keep a ledger of what they changed and what it cost). The continuation times
`prepare` apart from the model request, so postfork marginal time can be reported with and
without rewriting.
"""

from __future__ import annotations

from typing import Any, Protocol


class HistoryPolicy(Protocol):
    """One small object with one job. `prepare` must not change system, user, tool-call or
    observation messages, and must not mutate its argument."""

    name: str

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


class CleanPolicy:
    """The reference arm: the history unchanged."""

    name = "clean"

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages
