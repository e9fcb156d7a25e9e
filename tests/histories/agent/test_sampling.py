"""A live agent samples as its profile's model card says (issue 32): greedy or off-card sampling
lengthens or loops reasoning, the very length the suite measures. Checked on the request body
the agent would send; nothing is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.histories.agent.chat import ChatModel, config_for_profile
from compaction_bench.serve.errors import ProfileError
from compaction_bench.serve.profile import known_profiles, load_profile, profile_path

MESSAGES = [{"role": "user", "content": "fix the bug"}]


def body(profile: str) -> dict[str, object]:
    model = ChatModel(config_for_profile(load_profile(profile), "http://127.0.0.1:9", seed=3))
    return model.request_body(MESSAGES, index=0)


def test_each_gpu_profile_sends_its_model_cards_sampling() -> None:
    qwen = body("h100-qwen3-30b-a3b-thinking")
    assert (qwen["temperature"], qwen["top_p"], qwen["top_k"]) == (0.6, 0.95, 20)
    for name in ("b300-deepseek-v4-flash-nvfp4", "h200x2-deepseek-v4-flash",
                 "h200-gpt-oss-120b"):
        sent = body(name)
        assert (sent["temperature"], sent["top_p"]) == (1.0, 1.0), name
        assert "top_k" not in sent, name  # not on these cards: the engine's default stands
    # every GPU profile names its values and where they come from; none decodes greedily
    for name in known_profiles():
        profile = load_profile(name)
        if profile.engine == "cuda":
            assert profile.sampling is not None and profile.sampling.source, name
            assert profile.sampling.temperature > 0, name


def test_cpu_tiny_keeps_its_forced_text_sampling() -> None:
    sent = body("cpu-tiny")
    assert sent["temperature"] == 1.0 and sent["seed"] == 3
    assert "top_p" not in sent and "top_k" not in sent


def test_a_profile_without_sampling_falls_back_and_bad_values_are_refused(
        tmp_path: Path) -> None:
    base = profile_path("h100-qwen3-30b-a3b-thinking").read_text()
    cut = base[:base.index("[sampling]")]
    (tmp_path / "none.toml").write_text(cut)
    fallback = ChatModel(config_for_profile(load_profile(str(tmp_path / "none.toml")),
                                            "http://127.0.0.1:9")).request_body(MESSAGES)
    assert fallback["temperature"] == 0.7 and "top_p" not in fallback
    (tmp_path / "bad.toml").write_text(cut + '[sampling]\ntemperature = 0.6\ntop_p = 1.5\n'
                                             'source = "x"\n')
    with pytest.raises(ProfileError, match="top_p"):
        load_profile(str(tmp_path / "bad.toml"))
