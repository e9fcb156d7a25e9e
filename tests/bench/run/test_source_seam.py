"""The source seam (bench/run/source.py): a third source is a kind and a line in `KINDS`, and a
whole bench run (session, blocks, records, manifest, report) goes through it with nothing else
changed. The toy source replays only the first recorded turn of each arm's plan, on the fake
engine, whose replies are exactly `max_tokens` long; a source name nothing offers is one line."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compaction_bench.bench.run.compressors import Compressors
from compaction_bench.bench.run.config import BenchConfig, BenchError
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.bench.run.replay_source import ReplayKind, ReplaySource
from compaction_bench.bench.run.runner import run_bench
from compaction_bench.bench.run.source import Attempt, Opened, Result, Setup
from compaction_bench.bench.run.sources import KINDS, kind_of
from compaction_bench.histories.policies.base import HistoryPolicy
from compaction_bench.loadgen.fakeprocess import FakeConfig, FakeProcess
from compaction_bench.serve.profile import Profile

RECORD = "deepseek-v4-flash__atcoder-abc400_b__rep-01__seed-412000"


@dataclasses.dataclass(frozen=True)
class FirstTurnOnly(ReplaySource):
    """A third source: each arm's recorded plan, cut to its first turn."""

    name: str = "first-turn"

    def run(self, attempt: Attempt, policy: HistoryPolicy) -> Result:
        arm = attempt.arm
        assert arm.replay is not None
        cut = {k: dataclasses.replace(p, turns=p.turns[:1]) for k, p in arm.replay.items()}
        return super().run(dataclasses.replace(
            attempt, arm=dataclasses.replace(arm, replay=cut)), policy)


class FirstTurnKind(ReplayKind):
    name = "first-turn"

    def setup(self, opened: Opened, profile: Profile, url: str, compressors: Compressors,
              phases: PhaseLog) -> Setup:
        done = super().setup(opened, profile, url, compressors, phases)
        assert isinstance(done.source, ReplaySource)
        return dataclasses.replace(done, source=FirstTurnOnly(done.source.config,
                                                              done.source.wire))

    def banner(self, config: BenchConfig) -> str:
        return f"the first turn of {', '.join(config.records)}"


@pytest.fixture
def fake() -> Iterator[FakeProcess]:
    with FakeProcess(FakeConfig(ttft_ms=5, itl_ms=0.5)) as server:
        yield server


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.e2e
def test_a_third_source_runs_a_whole_bench_through_the_seam(
        fake: FakeProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "first-turn", FirstTurnKind())
    config = BenchConfig(regime="dedicated", profile="cpu-tiny", base_url=fake.api_url,
                         selfcheck=False, records=(RECORD,), blocks=2, run_id="toy",
                         arms=("clean", "external"), results_dir=str(tmp_path),
                         source="first-turn")  # the registry is the one list of sources
    said = io.StringIO()
    outcome = run_bench(config, stream=said)
    assert outcome.aborted is None, outcome.aborted
    run = tmp_path / "toy"
    arms = lines(run / "arms.jsonl")
    assert len(arms) == 4 and all(a["status"] == "complete" for a in arms)
    assert {a["source"] for a in arms} == {"first-turn"}
    assert all(a["forced_requests"] == a["forced_exact"] == a["turns"] == 1 for a in arms)
    requests = [r for r in lines(run / "requests.jsonl") if r.get("source") in ("clean",
                                                                                 "external")]
    assert len(requests) == 4  # one request per arm and block: the toy's own behaviour
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["source"] == "first-turn"
    assert manifest["replay"]["records"] == [RECORD]  # what its kind set up, as replay's
    assert "the first turn of " + RECORD in said.getvalue()  # the kind's own banner words


def test_every_source_has_a_kind_and_an_unknown_one_is_one_line(tmp_path: Path) -> None:
    for name, kind in KINDS.items():
        assert kind_of(name) is kind and kind.name == name
        assert "clean" in kind.arms
    with pytest.raises(BenchError, match=r"^SOURCE=nope: no such source; use one of agent, "
                                         r"replay$"):
        kind_of("nope")
    # a run refuses it before anything starts (no run folder, no server)
    with pytest.raises(BenchError, match=r"^SOURCE=nope: no such source"):
        run_bench(BenchConfig(regime="dedicated", profile="cpu-tiny", source="nope",
                              base_url="http://127.0.0.1:9/v1", results_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


def test_each_source_refuses_the_compaction_arm_it_cannot_run() -> None:
    # self-inline compacts live (a recording has no summary to replay); recorded is a log's
    # own compaction (a live agent has no log to take it from): one line each, naming the fix
    with pytest.raises(BenchError, match="self-inline compacts in context at run time"):
        kind_of("replay").check_arms(("clean", "self-inline"))
    with pytest.raises(BenchError, match="source=replay records="):
        kind_of("agent").check_arms(("clean", "recorded"))
    kind_of("agent").check_arms(("clean", "self", "self-inline"))
    kind_of("replay").check_arms(("clean", "recorded", "external"))
