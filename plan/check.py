"""The fleet plan checked against replicas behind a router (issue 24):
`compaction-bench plan check PLAN_RUN CHECK_RUN...` (`make plan-check`).

PLAN_RUN is a one-replica sweep, the plan's source. Each CHECK_RUN is a sweep run through vLLM's
router in front of R replicas (its manifest names them: `router.replicas`, config
`replica_urls`, or the per-replica self-checks; and the routing policy: `router.policy`, else
config `router_policy`, one per run folder `<run-id>-<policy>`), at the planned fleet for R
replicas (`SWEEP_LEVELS=<R x agents per replica>`). Per check run, arm and level N:

- predicted: the fleet model's SLO quantile (plan.fleetmodel: R simulated replicas behind the
  check run's policy, the consistent hash over the check run's own replica URLs, a prefix cache
  per replica), of the same time (plan.settings `slo_time`);
  where the model cannot run (no request records, a policy it does not know) the even split
  stands in, and the row says so; none past the plan's extrapolation reach;
- even split: the one-replica curve at N / R agents per replica, the old assumption that a
  router spreads the fleet evenly and each replica behaves as the one measured (issue 29: it
  read 31-75% under the measured p90 on two CPU replicas), with its own error beside;
- measured: the quantile of the check level's continuations (failures ranked as misses, as in
  the plan; a level whose failures alone exceed 1 - q misses), with a smoothed bootstrap
  interval (plan.capacity);
- held: measured quantile <= the plan's SLO in seconds; error: (predicted - measured) /
  measured in %, with n.

The check uses the plan's own settings, read from PLAN_RUN/plan.json (`plan_settings`): the
SLO, its time basis, the fleet, the reach, the bootstrap and its seed; a plan that was never
made is refused, and nothing on the command line can change what is checked (issue 29: the
check used to rebuild the plan from five flags and wrote it back over plan.md with its own
defaults). Written atomically as plan_check.json and plan_check.md into PLAN_RUN; the plan's
own files are never touched. The next `make plan` of PLAN_RUN states the policy its GPU counts
were checked under (`checked_under`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from compaction_bench.bench.analysis.replicas import continuation_cache, request_replicas
from compaction_bench.common.files import write_json_atomic, write_text_atomic
from compaction_bench.common.markdown import MISSING, number, percent, table
from compaction_bench.common.resampling import interval
from compaction_bench.common.resampling import quantile as hd_quantile
from compaction_bench.plan.capacity import _levels, _resample
from compaction_bench.plan.curve import MonotoneCurve
from compaction_bench.plan.observations import (
    HOST_NOTE,
    SWEEP,
    Observations,
    contended_note,
    observe,
)
from compaction_bench.plan.planner import Plan, build_plan
from compaction_bench.plan.settings import PlanConfig, PlanError

CHECK_JSON = "plan_check.json"
CHECK_MD = "plan_check.md"
CHECK_SCHEMA = "compbench.plan_check"
CHECK_SCHEMA_VERSION = 3  # 3: the routing columns and the replicas' inter-token times


@dataclass(frozen=True)
class Fleet:
    """How a check run was served: replicas behind a router, and its routing policy."""

    replicas: int | None
    policy: str


@dataclass(frozen=True)
class CheckRow:
    run_id: str
    policy: str
    replicas: int
    arm: str
    level: int
    per_replica: float
    planned: bool  # the level is the plan's fleet for these replicas (R x agents per replica)
    predicted_s: float | None  # the fleet model's (plan.fleetmodel); None: past the reach
    extrapolated: bool
    measured_s: float | None  # None: the level missed the SLO by failures alone
    measured_ci: tuple[float, float] | None
    n: int
    failed: int
    slo_s: float
    held: bool
    error_pct: float | None
    even_split_s: float | None = None  # the one-replica curve at N / R (the old prediction)
    even_split_error_pct: float | None = None
    model: str = "fleet model"  # what predicted_s is: "fleet model" or "even split"
    # what the routing did, predicted (the fleet model's simulated fleet at N) against measured
    # (the check level's own requests): the later turns' cached share of prompt tokens, and the
    # busiest replica's share of the requests (replicas inferred from their counters). Where
    # the error is large, these say whether the split or the cache, or neither, caused it.
    predicted_hit_rate: float | None = None
    measured_hit_rate: float | None = None
    predicted_hottest_share: float | None = None
    measured_hottest_share: float | None = None
    # the median inter-token time of the arm's requests in the check level, and in the plan's
    # sweep at the same agents per replica (None where that level was not measured): a fleet
    # whose replicas decode slower than the one measured replica, at the same load each, shares
    # something the plan's replica had alone (the host's memory bandwidth, the client's CPU)
    fleet_itl_s: float | None = None
    replica_itl_s: float | None = None
    # the plan's sweep did not measure this load per replica: replica_itl_s is interpolated
    # linearly between the two measured levels around it (printed with ~)
    replica_itl_interpolated: bool = False


def fleet_of(obs: Observations, replicas: int | None = None) -> Fleet:
    """The check run's replicas and routing policy, from its manifest (module docstring)."""
    config = obs.manifest.get("config") or {}
    found_router = obs.manifest.get("router")
    router: dict[str, Any] = found_router if isinstance(found_router, dict) else {}
    urls = router.get("replicas") or config.get("replica_urls") or []
    check = obs.manifest.get("selfcheck") or {}
    found = len(urls) or len(check.get("replicas") or {}) or replicas or None
    policies = [str(p) for p in config.get("router_policy") or []]
    named = [p for p in policies if obs.path.name.endswith(f"-{p}")]
    policy = (str(router["policy"]) if router.get("policy") else policies[0]
              if len(policies) == 1 else named[0] if named else
              "not recorded (BASE_URL as it was)")
    return Fleet(found, policy)


def _rows(plan: Plan, check: Observations, fleet: Fleet, rng: np.random.Generator
          ) -> list[CheckRow]:
    config = plan.config
    q, basis = config.target.quantile, config.slo_time
    assert fleet.replicas is not None
    rows = []
    model = _fleet_model(plan, check, fleet)
    served_by = request_replicas(check.records) or {}
    plan_requests = plan.observations.records.requests
    for arm, cap in plan.capacity.items():
        curve = MonotoneCurve([lv.level for lv in cap.levels], cap.quantiles,
                              [lv.n for lv in cap.levels])
        predictor = model.get(arm)
        for lv in _levels(check.of(arm, SWEEP)):
            per = lv.level / fleet.replicas
            even = None if per > cap.reach else curve(per)
            predicted = even if predictor is None or even is None else (
                predictor.predicted(fleet.policy, fleet.replicas, lv.level))
            measured: float | None = None
            ci = None
            if lv.n and not lv.missed(q):
                measured = float(hd_quantile(lv.times(basis), lv.rank(q)))
                ci = interval(_resample([lv], q, rng, config.bootstrap, basis)[0][:, 0],
                              config.confidence)
            error = (None if predicted is None or not measured else
                     (predicted - measured) / measured * 100)
            even_error = (None if even is None or not measured else
                          (even - measured) / measured * 100)
            simulated = None if predictor is None or even is None else predictor.run(
                fleet.policy, fleet.replicas, lv.level)
            hit, hottest = _routing_measured(check, arm, lv.level, served_by)
            alone_itl, interpolated = replica_itl(plan_requests, arm, per)
            rows.append(CheckRow(
                run_id=check.run_id, policy=fleet.policy, replicas=fleet.replicas, arm=arm,
                level=lv.level, per_replica=per,
                planned=cap.agents is not None and lv.level == fleet.replicas * cap.agents,
                predicted_s=predicted, extrapolated=curve.extrapolated(per),
                measured_s=measured, measured_ci=ci, n=lv.n_all, failed=lv.failed,
                slo_s=cap.slo_s, held=measured is not None and measured <= cap.slo_s,
                error_pct=error, even_split_s=even, even_split_error_pct=even_error,
                model="even split" if predictor is None else "fleet model",
                predicted_hit_rate=None if simulated is None else simulated.hit_rate,
                measured_hit_rate=hit,
                predicted_hottest_share=None if simulated is None else simulated.hottest_share,
                measured_hottest_share=hottest,
                fleet_itl_s=median_itl(check.records.requests, arm, lv.level),
                replica_itl_s=alone_itl, replica_itl_interpolated=interpolated))
    return rows


def replica_itl(requests: Any, arm: str, per: float) -> tuple[float | None, bool]:
    """The plan's one replica's median inter-token time at `per` agents: measured where the
    sweep has that level, else interpolated linearly between the measured levels around it
    (True); (None, False) outside the measured levels (an inter-token time is not
    extrapolated)."""
    if per == int(per) and (exact := median_itl(requests, arm, int(per))) is not None:
        return exact, False
    levels = sorted({r.labels.get("level") for r in requests if r.source == arm
                     and isinstance(r.labels.get("level"), int)})
    below = [lv for lv in levels if lv < per]
    above = [lv for lv in levels if lv > per]
    if not below or not above:
        return None, False
    low, high = below[-1], above[0]
    at_low, at_high = median_itl(requests, arm, low), median_itl(requests, arm, high)
    if at_low is None or at_high is None:
        return None, False
    return at_low + (at_high - at_low) * (per - low) / (high - low), True


def median_itl(requests: Any, arm: str, level: int) -> float | None:
    """The median inter-token time of `arm`'s ok requests at sweep level `level` (those with
    two tokens or more), seconds; None where there are none."""
    gaps = [(r.end_s - r.first_token_s) / (r.completion_tokens - 1) for r in requests
            if r.source == arm and r.ok and r.labels.get("level") == level
            and r.first_token_s is not None and r.end_s is not None
            and (r.completion_tokens or 0) >= 2]
    return float(np.median(gaps)) if gaps else None


SLOWER_STEPS = 1.2  # fleet / one-replica inter-token time above which check_markdown says so
SLOWER_NOTE = "Slower replicas"


def slower_steps_note(rows: list[CheckRow]) -> str | None:
    """One line where the fleet's replicas decoded slower per token than the plan's replica at
    the same agents per replica: a cause of error that neither prediction contains."""
    ratios = [(r, r.fleet_itl_s / r.replica_itl_s) for r in rows
              if r.fleet_itl_s and r.replica_itl_s]
    slow = [(r, x) for r, x in ratios if x > SLOWER_STEPS]
    if not slow:
        return None
    low, high = min(x for _, x in slow), max(x for _, x in slow)
    return (f"{SLOWER_NOTE}: in {len(slow)} of {len(ratios)} rows the fleet's replicas took "
            f"{100 * (low - 1):.0f}-{100 * (high - 1):.0f}% longer per generated token than the "
            "plan's one replica at the same agents per replica (median inter-token time). They "
            "shared something the measured replica had alone (on one host: memory bandwidth, "
            "the client's and the router's CPU; a CPU set and a quota cap a replica, they "
            "reserve nothing), and neither the fleet model nor the even split contains it: "
            "expect the measured quantile above the prediction by about as much.")


def _routing_measured(check: Observations, arm: str, level: int,
                      served_by: dict[str, str | None]) -> tuple[float | None, float | None]:
    """The check level's later-turn hit rate (its measured continuations, as the fleet model
    counts them) and its busiest replica's share of the arm's requests (those attributed)."""
    own = [r for r in check.records.requests if r.source == arm and r.ok
           and r.labels.get("level") == level]
    measured = [r for r in own if r.labels.get("sweep_phase") in (None, "measured")]
    found = continuation_cache(measured, [arm])
    rate = found[0].later if found else None
    hit = (rate.cached_tokens / rate.prompt_tokens) if rate and rate.prompt_tokens else None
    counts = Counter(served_by.get(r.request_id) for r in own)
    counts.pop(None, None)
    total = sum(counts.values())
    return hit, (max(counts.values()) / total if total else None)


def _fleet_model(plan: Plan, check: Observations, fleet: Fleet) -> dict[str, Any]:
    """Per arm, the fleet model's predictor (plan.fleetmodel) with the check run's own replica
    URLs (the consistent hash's ring); {} where the policy is not one the model knows or the
    plan run has no request records to fit the engine on."""
    from compaction_bench.plan.fleetmodel import POLICIES, arm_predictor, engine_fit

    if fleet.policy not in POLICIES:
        return {}
    router = check.manifest.get("router")
    urls = [str(u) for u in (router.get("replicas") or [])] if isinstance(router, dict) else []
    try:
        fit = engine_fit(plan.observations)
    except PlanError:
        return {}
    out = {}
    for arm, cap in plan.capacity.items():
        found = arm_predictor(plan.observations, fit, arm, cap, plan.config,
                              urls if len(urls) == fleet.replicas else None)
        if found is not None:
            out[arm] = found
    return out


SHARE_NOTE = "Warning: host share not recorded"


def host_share_note(plan: Plan, check: Observations) -> str | None:
    """Refuse, in one line, a check run whose replicas had another share of the host than the
    plan run's replica (a CPU set of another size, another cpu.max quota: issue 29; the
    manifests' `server.replicas[].host_share`, serve.share); a warning line for plan_check.md
    where either run records none (a run from before shares were recorded), None where the
    shares are equal."""
    from compaction_bench.serve.share import describe_share, share_key

    def shares(obs: Observations) -> list[Any]:
        server = obs.manifest.get("server")
        listed = server.get("replicas") if isinstance(server, dict) else None
        return [r.get("host_share") for r in listed or [] if isinstance(r, dict)] or [None]

    planned, checked = shares(plan.observations), shares(check)
    keys = {share_key(s) for s in planned + checked}
    plan_id = plan.observations.run_id
    if None in keys:
        unrecorded = [run for run, found in ((plan_id, planned), (check.run_id, checked))
                      if any(share_key(s) is None for s in found)]
        return (f"{SHARE_NOTE} in {' and '.join(unrecorded)}: compared with {check.run_id} "
                "without knowing that each replica had the same share of the host (serve both "
                "with the same REPLICA_CPUS / REPLICA_CPU_QUOTA to know it).")
    if len(keys) > 1:
        raise PlanError(
            f"{plan_id} (plan: replica {describe_share(planned[0])}) and {check.run_id} "
            f"(replicas: {'; '.join(describe_share(s) for s in checked)}) ran under different "
            "shares of the host per replica, so the plan cannot be checked on it: serve both "
            "with the same REPLICA_CPUS / REPLICA_CPU_QUOTA (make serve REPLICA_CPUS=1, then "
            "make serve REPLICAS=2 REPLICA_CPUS=1) and measure again")
    return None


def check_plan(config: PlanConfig, check_runs: list[Path], replicas: int | None = None
               ) -> tuple[Plan, list[CheckRow]]:
    """The plan of `config.run_dir` and its check against every check run."""
    plan = build_plan(config)
    if not plan.sweep:
        raise PlanError(f"{config.run_dir}: the plan to check needs a one-replica sweep "
                        "(make bench REGIME=sweep); this run has none")
    rng = np.random.default_rng(config.seed + 2)
    rows: list[CheckRow] = []
    for path in check_runs:
        check = observe(path)
        if not check.is_sweep:
            raise PlanError(f"{path}: not a sweep run; run the check as REGIME=sweep "
                            "SWEEP_LEVELS=<planned agents for the replicas> through the router")
        fleet = fleet_of(check, replicas)
        if (note := host_share_note(plan, check)) is not None:
            plan.notes.append(note)
        if (note := contended_note(check)) is not None:
            plan.notes.append(note)
        if fleet.replicas is None:
            raise PlanError(f"{path}/manifest.json: names no replicas (config replica_urls, "
                            "selfcheck.replicas); give replicas=R (make plan-check REPLICAS=R)")
        rows += _rows(plan, check, fleet, rng)
    return plan, rows


def check_document(plan: Plan, rows: list[CheckRow]) -> dict[str, Any]:
    return {"schema": CHECK_SCHEMA, "schema_version": CHECK_SCHEMA_VERSION,
            "plan_run": plan.observations.run_id,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "slo": plan.config.target.text, "slo_time": plan.config.slo_time,
            "confidence": plan.config.confidence, "bootstrap": plan.config.bootstrap,
            "policies": sorted({r.policy for r in rows}),
            "rows": [{**asdict(r), "measured_ci": None if r.measured_ci is None
                      else list(r.measured_ci)} for r in rows]}


def check_markdown(plan: Plan, rows: list[CheckRow]) -> str:
    q = f"p{100 * plan.config.target.quantile:g}"
    lines = [f"# The plan of {plan.observations.run_id} checked behind a router", "",
             f"Predicted: the fleet model's {q} of {plan.config.slo_time} time at N agents on "
             "R replicas behind the run's policy (plan/fleetmodel.py; `even split` where it "
             f"cannot run); even split: the one-replica curve's {q} at N / R, the old "
             f"assumption; measured: the check level's {q} (failures as misses) with its "
             f"{100 * plan.config.confidence:g}% bootstrap interval; SLO "
             f"{plan.config.target.label}; error = (predicted - measured) / measured "
             "(plan/check.py). The routing columns say what the split and the cache did, "
             "predicted against measured; ms per token compares the fleet's replicas with the "
             "plan's one at the same agents per replica (median inter-token time; ~: "
             "interpolated between the two measured levels around it): where the error comes "
             "from.", ""]
    lines += [f"{note}\n" for note in plan.notes if note.startswith((SHARE_NOTE, HOST_NOTE))]
    cells = [[r.policy, str(r.replicas), r.arm, f"{r.level}{' (planned)' if r.planned else ''}",
              f"{number(r.predicted_s, 1)}{' (extrapolated)' if r.extrapolated else ''}"
              f"{' (even split)' if r.model != 'fleet model' else ''}"
              if r.predicted_s is not None else "beyond measured range",
              "missed (failures)" if r.measured_s is None else
              f"{number(r.measured_s, 1)} [{number(low, 1)}, {number(high, 1)}]",
              number(r.slo_s, 1), "yes" if r.held else "**no**",
              percent(r.error_pct, 1, sign=True),
              MISSING if r.even_split_s is None else (
                  f"{number(r.even_split_s, 1)} ({r.even_split_error_pct:+.1f}%)"
                  if r.even_split_error_pct is not None else number(r.even_split_s, 1)),
              f"{percent(r.predicted_hit_rate, 0, fraction=True)} / "
              f"{percent(r.measured_hit_rate, 0, fraction=True)}",
              f"{percent(r.predicted_hottest_share, 0, fraction=True)} / "
              f"{percent(r.measured_hottest_share, 0, fraction=True)}",
              f"{number(None if r.fleet_itl_s is None else 1000 * r.fleet_itl_s, 0)} / "
              f"{'~' if r.replica_itl_interpolated else ''}"
              f"{number(None if r.replica_itl_s is None else 1000 * r.replica_itl_s, 0)}",
              f"{r.n} ({r.failed} failed)", r.run_id]
             for r in rows for low, high in [r.measured_ci or (None, None)]]
    lines += table(["policy", "replicas", "arm", "N", f"predicted {q} s", f"measured {q} s",
                    "SLO s", "held", "error", f"even split {q} s (error)",
                    "later-turn hit rate, predicted / measured",
                    "busiest replica's share, predicted / measured",
                    "ms per token, fleet / one replica", "n", "run"], cells)
    if (note := slower_steps_note(rows)) is not None:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def check_notes(markdown: Path) -> list[str]:
    """The check's host notes (contended cells of the plan's run or a check run; replicas
    that decoded slower than the plan's), for the command line to print beside its rows."""
    return [line for line in markdown.read_text(encoding="utf-8").splitlines()
            if line.startswith((HOST_NOTE, SLOWER_NOTE))]


def plan_settings(run_dir: Path) -> PlanConfig:
    """The settings the plan of `run_dir` was made with (its plan.json), for checking it."""
    path = run_dir / "plan.json"
    if not path.is_file():
        raise PlanError(f"{path}: no plan to check; make it first: make plan RUN={run_dir.name} "
                        "[SLO=...] [AGENTS=...]")
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))["config"]
        return PlanConfig.model_validate({**stored, "run_dir": run_dir, "plots": False})
    except (PlanError, ValueError, KeyError, TypeError) as error:
        if isinstance(error, ValidationError):
            first = error.errors()[0]
            why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
        else:
            why = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PlanError(f"{path}: field config is not a plan's settings ({why}); make the "
                        f"plan again: make plan RUN={run_dir.name}") from error


def write_check(config: PlanConfig, check_runs: list[Path], replicas: int | None = None
                ) -> tuple[Path, Path, list[CheckRow]]:
    """Check the plan made with `config` and write plan_check.json and .md beside it; the
    plan's own files are left as they are."""
    plan, rows = check_plan(config, check_runs, replicas)
    out = config.run_dir
    write_json_atomic(out / CHECK_JSON, check_document(plan, rows))
    write_text_atomic(out / CHECK_MD, check_markdown(plan, rows))
    return out / CHECK_MD, out / CHECK_JSON, rows


def checked_under(check: dict[str, Any] | None, planned: dict[str, int] | None = None
                  ) -> str:
    """plan.md's line on what the GPU counts assume about the router: `check` is the run's
    plan_check.json (None where `make plan-check` has not run), `planned` per arm the planned
    fleet for two replicas (the check's SWEEP_LEVELS)."""
    if check is None:
        levels = ", ".join(f"{arm} {n}" for arm, n in (planned or {}).items())
        return ("GPU counts assume that replicas behind a router each carry one measured "
                "replica's agents; unchecked: measure it with `make plan-check PLAN=<this run> "
                "RUNS=\"<sweep through the router>...\"`" + (
                    f" (the planned fleet for 2 replicas: {levels})" if levels else "") + ".")
    parts = []
    for policy in check.get("policies") or []:
        own = [r for r in check.get("rows") or [] if r.get("policy") == policy]
        held = all(r.get("held") for r in own)
        errors = [abs(r["error_pct"]) for r in own if r.get("error_pct") is not None]
        worst = f", largest prediction error {max(errors):.1f}%" if errors else ""
        verdict = "SLO held at every checked level" if held else "SLO missed at a checked level"
        parts.append(f"{policy} ({verdict}{worst})")
    return (f"GPU counts assume the routing policy they were checked under ({CHECK_MD}, SLO "
            f"{check.get('slo')} on {check.get('slo_time')} time): "
            f"{'; '.join(parts) or 'no checked level'}.")
