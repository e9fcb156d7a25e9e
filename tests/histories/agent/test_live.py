"""Acquisition, continuation and the render audit against the real vLLM CPU server."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.common.paths import histories_root
from compaction_bench.histories.agent.acquisition import acquire
from compaction_bench.histories.agent.audit import audit
from compaction_bench.histories.agent.chat import ChatModelConfig, config_for_profile
from compaction_bench.histories.agent.continuation import continue_history
from compaction_bench.histories.format.export import export_minisweagent
from compaction_bench.histories.format.history import load_history, message_action, save_history
from compaction_bench.histories.format.importers import import_history
from compaction_bench.histories.tasks.task import load_task
from compaction_bench.serve.launcher import Server
from compaction_bench.serve.profile import load_profile

pytestmark = pytest.mark.integration
STUDY = histories_root() / "study"


def config(server: Server) -> ChatModelConfig:
    return config_for_profile(load_profile("cpu-tiny"), server.api_url, seed=0)


@pytest.fixture(scope="module")
def acquired(cpu_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    got = acquire(load_task("fix-median"), config(cpu_server), fork_turn=2,
                  provenance={"profile": "cpu-tiny"})
    path = tmp_path_factory.mktemp("acquired") / "clean.json"
    save_history(got.history, path)
    return path


def test_acquisition_stops_at_the_fork_with_provenance(acquired: Path) -> None:
    history = load_history(acquired)
    assert history.fork is not None and history.arm == "clean"
    fork_message = history.messages[history.fork.message_index]
    assert fork_message["role"] == "assistant"
    assert message_action(fork_message, "text") == {"command": history.fork.action["command"]}
    assert history.messages[-1] is fork_message or history.messages[-1] == fork_message
    assert "<returncode>" in (history.fork.pending_result or "")
    actions = [m for m in history.messages if message_action(m, "text")]
    assert len(actions) == 2  # fork_turn=2: one executed action, then the pending one
    p = history.provenance
    assert p["structured_text"] is True and p["sampling"]["seed"] == 0
    assert p["server_version"] and p["task_sha256"] and p["profile"] == "cpu-tiny"
    timing = fork_message["extra"]["request"]
    assert timing["first_token_s"] >= timing["sent_s"] and timing["prompt_tokens"] > 0


def test_history_exports_to_minisweagent_and_reimports_equal(acquired: Path,
                                                             tmp_path: Path) -> None:
    history = load_history(acquired)
    exported = tmp_path / "export.traj.json"
    import json

    exported.write_text(json.dumps(export_minisweagent(history)))
    back = import_history(exported)
    assert back.messages == history.messages and back.fork == history.fork
    assert (back.task, back.arm) == (history.task, history.arm)


def test_continuation_runs_to_a_terminal_status_with_real_tools(acquired: Path,
                                                                 cpu_server: Server) -> None:
    history = load_history(acquired)
    result = continue_history(history, load_task("fix-median"), config(cpu_server),
                              step_limit=3)
    assert result.error is None
    assert result.terminal_status in {"Submitted", "LimitsExceeded", "RepeatedFormatError"}
    assert result.postfork_s > 0 and result.setup_s >= 0
    assert result.requests and all(r.status == "ok" for r in result.requests)
    assert all(r.end_s >= r.sent_s and r.completion_tokens for r in result.requests)
    # the continuation began with the saved prefix and the pending result, then executed
    # its own actions for real: their observations carry return codes
    assert result.messages[: history.fork.message_index + 1] == history.messages  # type: ignore[union-attr]
    later = result.messages[history.fork.message_index + 2 :]  # type: ignore[union-attr]
    assert any("<returncode>" in str(m.get("content")) for m in later if m["role"] == "user")
    assert result.validation is not None


def test_render_audit_of_text_protocol_history(acquired: Path, cpu_server: Server) -> None:
    result = audit(load_history(acquired), cpu_server.api_url)
    assert result.tokens_b > result.tokens_a > 0
    assert result.a_is_prefix_of_b  # SmolLM2's template appends; the cache reuses all of A
    assert result.reasoning_blocks == 2 and result.reasoning_blocks_kept == 2


def test_render_audit_shows_template_dropping_native_reasoning(cpu_server: Server) -> None:
    """The study's DeepSeek history carries native reasoning; SmolLM2's template ignores the
    reasoning field, so compaction could change nothing with this model: the audit says so."""
    path = next(STUDY.glob("*vaccine*/clean.json"))
    result = audit(load_history(path), cpu_server.api_url)
    assert result.reasoning_blocks > 0 and result.reasoning_blocks_kept == 0
    assert "cannot change what this model sees" in result.summary()
