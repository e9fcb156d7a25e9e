"""A compressor model that rambles gets its first draft capped per raw word by its profile
(`compressor_tokens_per_raw_word`), in `make bench` and in `histories compact` alike; a
profile that says nothing keeps the study's fixed cap."""

from __future__ import annotations

from pathlib import Path

from compaction_bench.bench.run.compressors import open_compressors
from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.bench.run.phases import PhaseLog
from compaction_bench.serve.profile import load_profile


def caps(profile_name: str, tmp_path: Path) -> dict[str, float | None]:
    profile = load_profile(profile_name)
    config = BenchConfig(arms=("clean", "self", "external"), profile=profile_name)
    # the embedded external compressor is started lazily, by its first rewrite: none here
    with open_compressors(config, profile, "http://127.0.0.1:9/v1", tmp_path, 0.0,
                          PhaseLog(tmp_path, 0.0)) as found:
        return {name: c.max_tokens_per_raw_word for name, c in found.configs.items()}


def test_the_cpu_profiles_cap_their_rambling_compressors_per_word(tmp_path: Path) -> None:
    assert load_profile("cpu-tiny").model.compressor_tokens_per_raw_word == 2.0
    assert load_profile("cpu-gemma-compressor").model.compressor_tokens_per_raw_word == 2.0
    assert caps("cpu-tiny", tmp_path) == {"self": 2.0, "external": 2.0}


def test_a_profile_that_sets_no_cap_keeps_the_studys_fixed_cap(tmp_path: Path) -> None:
    profile = load_profile("h100-qwen3-30b-a3b-thinking")
    assert profile.model.compressor_tokens_per_raw_word is None
    config = BenchConfig(arms=("clean", "self"), profile=profile.name)
    with open_compressors(config, profile, "http://127.0.0.1:9/v1", tmp_path, 0.0,
                          PhaseLog(tmp_path, 0.0)) as found:
        (self_config,) = found.configs.values()
    assert self_config.max_tokens_per_raw_word is None and self_config.max_tokens == 1024
