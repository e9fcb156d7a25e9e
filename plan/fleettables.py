"""The fleet model's figures as plan.md's section and plan.json's `fleet` (plan.fleetmodel)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from compaction_bench.common.markdown import number, percent, table
from compaction_bench.plan.fleetmodel import FleetPlan, FleetRow
from compaction_bench.serve.routerhash import ROUTING_KEYS


def _n(value: int | None, most: int) -> str:
    return f"> {most}" if value is None else str(value)


def _s(value: float | None) -> str:
    return number(value if value is None or math.isfinite(value) else None, 1)


def _pct(value: float | None) -> str:
    return percent(value, 0, fraction=True)


def fleet_markdown(fleet: FleetPlan | None, agents: int, quantile: float) -> list[str]:
    """plan.md's fleet section (empty where no fleet was planned)."""
    if fleet is None:
        return []
    q = f"p{100 * quantile:g}"
    lines = ["## Fleets behind vLLM's router", ""]
    if not fleet.rows:
        return [*lines, *(f"- {note}" for note in fleet.notes or ["no fleet rows"]), ""]
    fit = fleet.fit
    lines += [
        "Per routing policy, the largest fleet of R replicas whose predicted "
        f"{q} meets the SLO (plan/fleetmodel.py): R simulated replicas of the engine fitted on "
        "this sweep's requests behind the policy as vllm-router 0.1.17 applies it, with a "
        "prefix cache per replica. `band`: the same with the simulated quantiles times 1 + e "
        "and 1 - e, e the model's median error at one replica (below). `even split`: the "
        f"one-replica curve at N / R, the old assumption. GPUs: for {agents} agents under the "
        "policy.", ""]
    cells = [[r.arm, r.policy, str(r.replicas), f"**{_n(r.agents, r.most)}**",
              f"[{_n(r.band[0], r.most)}, {_n(r.band[1], r.most)}]",
              "-" if r.agents is None else f"{r.agents / r.replicas:.1f}",
              f"{_s(r.predicted_s)} (SLO {_s(r.slo_s)})", _s(r.even_split_s),
              _pct(r.hit_rate), _pct(r.hottest_share),
              "-" if r.gpus is None else str(r.gpus)] for r in fleet.rows]
    lines += table(["arm", "policy", "replicas", "agents per fleet", "band", "per replica",
                    f"predicted {q} s at it", f"even split {q} s", "later-turn hit",
                    "hottest replica's requests", f"GPUs for {agents}"], cells)
    lines += ["", "What each policy routes on (measured on vllm-router 0.1.17, "
              "tests/serve/test_routing_keys.py):", ""]
    lines += [f"- {policy}: {ROUTING_KEYS.get(policy, 'not known')}"
              for policy in sorted({r.policy for r in fleet.rows})]
    hashed = ("the given REPLICA_URLS" if fleet.urls else
              "the URLs of `make serve REPLICAS=R` on port 8000")
    lines += ["", f"consistent_hash is the router's own ring over {hashed}; another set of "
              "URLs splits the same sessions otherwise.", ""]
    lines += [f"The engine fitted: {fit.slots} slots; prefill {1000 * fit.prefill_base_s:.1f} ms "
              f"+ {1e6 * fit.prefill_s_per_token:.1f} us per uncached token + "
              f"{1e6 * fit.cached_s_per_token:.1f} us per cached token ({fit.n_prefill} "
              f"requests at the lowest level); decode step {1000 * fit.step_base_s:.2f} ms + "
              f"{1000 * fit.step_s_per_seq:.2f} ms per running sequence + "
              f"{1e6 * fit.step_s_per_context_token:.3f} us per token of the batch's context "
              f"({fit.n_levels} levels); "
              f"cache blocks of {fit.block_tokens} tokens.", ""]
    lines += ["The model's own error at one replica (simulated against measured p"
              f"{100 * quantile:g}):", ""]
    for arm, errors in fleet.one_replica_error.items():
        said = ", ".join(f"N={e['level']:g} {e['simulated_s']:.1f} vs {e['measured_s']:.1f} s "
                         f"({e['ape_pct']:.0f}%)" for e in errors)
        median = fleet.median_error_pct(arm)
        lines.append(f"- {arm}: {said}; median {median:.0f}%" if median is not None else
                     f"- {arm}: no level")
    lines += [f"- {note}" for note in fleet.notes]
    return [*lines, ""]


def fleet_json(fleet: FleetPlan | None) -> dict[str, Any] | None:
    """plan.json's `fleet` (plan/SCHEMA.md)."""
    if fleet is None:
        return None

    def row(r: FleetRow) -> dict[str, Any]:
        out = dataclasses.asdict(r)
        out["band"] = list(r.band)
        return out

    return {"engine_fit": dataclasses.asdict(fleet.fit), "rows": [row(r) for r in fleet.rows],
            "one_replica_error": fleet.one_replica_error,
            "replica_urls": list(fleet.urls) if fleet.urls else None, "notes": fleet.notes,
            "routing_keys": {p: ROUTING_KEYS.get(p) for p in sorted({r.policy
                                                                     for r in fleet.rows})}}
