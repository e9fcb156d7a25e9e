"""The engine seam (serve/engines/): a profile's `server` picks the module that builds its
command, environment and machine check; the launcher's own part (CPU set, cgroup, the profile's
environment) is the same around every engine; a name no engine has is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.serve.command import ServerConfig, build_command, build_env
from compaction_bench.serve.engines.fake import FAKE_MODULE
from compaction_bench.serve.engines.registry import ENGINES, engine_of
from compaction_bench.serve.engines.vllm import ALWAYS_ON, OFFLINE_ENV, SERVER_MODULE
from compaction_bench.serve.errors import ProfileError
from compaction_bench.serve.profile import PROFILE_DIR, known_profiles, load_profile


def test_every_shipped_profile_names_an_engine_that_builds_its_command() -> None:
    for name in known_profiles():
        profile = load_profile(name)
        engine = engine_of(profile)
        assert engine is ENGINES[profile.server_name]
        command = build_command(ServerConfig(profile=profile, port=8123), "m")
        module = command[command.index("-m") + 1]
        assert module == (FAKE_MODULE if profile.engine == "fake" else SERVER_MODULE), name


def test_the_server_field_not_the_device_picks_the_engine(tmp_path: Path) -> None:
    text = (PROFILE_DIR / "cpu-tiny.toml").read_text()
    vllm = load_profile("cpu-tiny")
    assert vllm.server is None and vllm.server_name == "vllm"
    path = tmp_path / "cpu-fake.toml"
    path.write_text(text.replace('engine = "cpu"', 'engine = "cpu"\nserver = "fake"', 1))
    fake = load_profile(str(path))
    assert fake.engine == "cpu" and fake.server_name == "fake"
    pinned = ServerConfig(profile=fake, port=8124, cpus=(1,), cpu_quota=None)
    command = build_command(pinned, "m")
    # the launcher's part around the engine's: the CPU set, then the fake server's command
    assert command[:3] == ["taskset", "-c", "1"] and command[4:6] == ["-m", FAKE_MODULE]
    assert not set(ALWAYS_ON) & set(command)
    # vLLM's environment (offline mode, OpenMP bound to the CPU set) is vLLM's only
    assert "VLLM_CPU_OMP_THREADS_BIND" not in build_env(pinned)
    on_vllm = build_env(ServerConfig(profile=vllm, port=8125, cpus=(1,)))
    assert on_vllm["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert all(on_vllm[k] == v for k, v in OFFLINE_ENV.items())


def test_an_engine_no_module_offers_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "sglang.toml"
    path.write_text((PROFILE_DIR / "cpu-tiny.toml").read_text().replace(
        'engine = "cpu"', 'engine = "cpu"\nserver = "sglang"', 1))
    with pytest.raises(ProfileError, match=r"field server: .*'vllm' or 'fake'") as err:
        load_profile(str(path))
    assert len(str(err.value).splitlines()) == 1


def test_a_cpu_profiles_bfloat16_runs_in_float32_where_the_cpu_has_no_avx512() -> None:
    # measured on the 2-core AMD EPYC machine (AVX2 only): a 3,031-token prefill took 95 s in
    # bfloat16 and 24.5 s in float32, and the default `make bench` stalled out on the former
    from compaction_bench.serve.engines.vllm import cpu_dtype
    from compaction_bench.serve.hardware import cpu_flags, fast_bfloat16

    tiny = load_profile("cpu-tiny")
    assert tiny.engine_args.dtype == "bfloat16"
    dtype, note = cpu_dtype(tiny, frozenset({"sse4_2", "avx2", "fma"}))
    assert dtype == "float32" and note is not None and "no AVX-512" in note
    assert cpu_dtype(tiny, frozenset({"avx2", "avx512f", "avx512bw"})) == ("bfloat16", None)
    gpu = load_profile("h200-gpt-oss-120b")
    assert cpu_dtype(gpu, frozenset({"avx2"})) == (gpu.engine_args.dtype, None)
    # this host: the command carries what the host decides, and the flags are the real ones
    here = fast_bfloat16()
    command = build_command(ServerConfig(profile=tiny, port=8125), "m")
    expected = "bfloat16" if here in (True, None) else "float32"
    assert command[command.index("--dtype") + 1] == expected
    assert here is None or ("avx512f" in cpu_flags()) == here
