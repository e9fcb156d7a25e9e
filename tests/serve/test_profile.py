from __future__ import annotations

from pathlib import Path

import pytest

from common.paths import repo_root
from serve.errors import ProfileError
from serve.launcher import ALWAYS_ON, ServerConfig, build_command
from serve.profile import default_profile, known_profiles, load_profile

SHIPPED = {
    "cpu-tiny",
    "b300-deepseek-v4-flash-nvfp4",
    "h200x2-deepseek-v4-flash",
    "h200-gpt-oss-120b",
    "h100-qwen3-30b-a3b-thinking",
}


def test_every_shipped_profile_loads_and_serves_a_compressor_alias() -> None:
    assert set(known_profiles()) >= SHIPPED
    for name in known_profiles():
        p = load_profile(name)
        assert p.model.compressor_name == "compressor", name
        assert p.regimes.shared_users < p.engine_args.max_num_seqs < p.overloaded_users


def test_study_profile_matches_appendix_e2() -> None:
    p = load_profile("b300-deepseek-v4-flash-nvfp4")
    e = p.engine_args
    assert (e.tensor_parallel_size, e.max_num_seqs, e.block_size) == (1, 32, 256)
    assert (e.reasoning_parser, e.tool_call_parser, e.enable_auto_tool_choice) == (
        "deepseek_v4", "deepseek_v4", True)
    assert p.overloaded_users == 64


def test_cpu_tiny_is_embedded_and_regimes_scale_with_the_sequence_limit() -> None:
    p = load_profile("cpu-tiny")
    assert p.model.source.startswith("embedded:")
    assert p.overloaded_users == 2 * p.engine_args.max_num_seqs


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("b200-nonexistent")
    message = str(err.value)
    assert "unknown profile 'b200-nonexistent'" in message
    for name in SHIPPED:
        assert name in message


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


GOOD = (repo_root() / "serve" / "profiles" / "cpu-tiny.toml").read_text()


def test_malformed_value_names_file_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("max_num_seqs = 4 ", 'max_num_seqs = "many" '))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(path) in str(err.value)
    assert "field engine_args.max_num_seqs" in str(err.value)
    assert "'many'" in str(err.value)


def test_unknown_field_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("[engine_args]", "[engine_args]\nmax_num_seq = 4"))
    with pytest.raises(ProfileError, match=r"field engine_args\.max_num_seq: unknown field"):
        load_profile(str(path))


def test_missing_field_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('engine = "cpu"', ""))
    with pytest.raises(ProfileError, match="field engine: required field is missing"):
        load_profile(str(path))


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + "\n[regimes\n")
    with pytest.raises(ProfileError, match=rf"{path}: not valid TOML"):
        load_profile(str(path))


def test_shared_regime_must_stay_below_the_sequence_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("shared_users = 2", "shared_users = 4"))
    with pytest.raises(ProfileError, match=r"shared_users \(4\) must be below"):
        load_profile(str(path))


def test_command_always_enables_prefix_caching_and_cached_token_details() -> None:
    p = load_profile("b300-deepseek-v4-flash-nvfp4")
    cmd = build_command(ServerConfig(profile=p, port=8123), "/models/v4")
    for flag in ALWAYS_ON:
        assert flag in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--served-model-name") + 1 : cmd.index("--served-model-name") + 3] == [
        "target", "compressor"]
    assert cmd[cmd.index("--block-size") + 1] == "256"
    assert "--api-key" not in cmd
    keyed = build_command(ServerConfig(profile=p, api_key="s3cret"), "/m")
    assert keyed[keyed.index("--api-key") + 1] == "s3cret"


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ([], "cpu-tiny"),
        (["NVIDIA B300 SXM6 AC"], "b300-deepseek-v4-flash-nvfp4"),
        (["NVIDIA H200"], "h200-gpt-oss-120b"),
        (["NVIDIA H200", "NVIDIA H200"], "h200x2-deepseek-v4-flash"),
        (["NVIDIA H100 80GB HBM3"], "h100-qwen3-30b-a3b-thinking"),
    ],
)
def test_default_profile_follows_the_gpu(gpus: list[str], expected: str) -> None:
    assert default_profile(gpus) == expected


def test_default_profile_refuses_an_unknown_gpu() -> None:
    with pytest.raises(ProfileError, match="no shipped profile is made for GPU 'Tesla T4'"):
        default_profile(["Tesla T4"])
