"""What the serve-time self-check found: one `CheckResult` per check, gathered in a
`SelfCheckReport` that the bench writes into its run manifest (`to_json`) and `make serve`
prints (`lines`). A failed check raises `SelfCheckError`, whose first line names what failed and
the likely fix, and which carries the report so the caller can still record it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from compaction_bench.common.errors import ExitCode
from compaction_bench.serve.errors import ServeError

Status = Literal["pass", "fail", "not run"]
SCHEMA = 1


@dataclass(frozen=True)
class CheckResult:
    """One check: `detail` says what was seen (one line), `fix` the likely fix when it failed,
    `data` the measured values (tokens, counters, timings) for the manifest."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass(frozen=True)
class SelfCheckReport:
    """The self-check of one server for one profile, as it ran.

    `server_version` is the server's `/version`; `cache_config` the labels of vLLM's
    `vllm:cache_config_info` gauge on `/metrics` (the engine's effective cache arguments: block
    size, prefix caching, retention interval, KV blocks); `models` what `/v1/models` lists;
    `command` the launcher's command line when the suite started the server (None for a server
    it was pointed at). `duration_s` is wall time on the monotonic clock.
    """

    profile: str
    api_url: str
    server_version: str | None
    cache_config: dict[str, str]
    models: tuple[dict[str, Any], ...]
    command: tuple[str, ...] | None
    checks: tuple[CheckResult, ...]
    duration_s: float

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.failed)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["schema"] = SCHEMA
        data["passed"] = self.passed
        data["command"] = list(self.command) if self.command is not None else None
        return data

    def lines(self) -> list[str]:
        """The report as `make serve` prints it: a header, then one line per check."""
        failed = len(self.failures)
        verdict = "passed" if not failed else f"FAILED ({failed} of {len(self.checks)})"
        out = [f"== self-check of {self.api_url} (profile {self.profile}, vLLM "
               f"{self.server_version or 'unknown'}): {verdict} in {self.duration_s:.1f} s =="]
        mark = {"pass": "ok  ", "fail": "FAIL", "not run": "--  "}
        for check in self.checks:
            out.append(f"  {mark[check.status]} {check.name}: {check.detail}")
            if check.failed and check.fix:
                out.append(f"       fix: {check.fix}")
        return out


class SelfCheckError(ServeError):
    """A self-check failed: the server would produce wrong or missing figures. The message's
    one line names the first failed check and its likely fix; `report` has them all."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, report: SelfCheckReport) -> None:
        first, *others = report.failures
        more = f" ({len(others)} more failed: {', '.join(c.name for c in others)})" if (
            others) else ""
        super().__init__(f"self-check of {report.api_url} (profile {report.profile}) failed: "
                         f"{first.detail}; {first.fix}{more}")
        self.report = report
