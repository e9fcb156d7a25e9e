"""Typed settings from layers (common/settings.py) on the bench's own config: a setting declared
once has its file key, its `name=value` word and its make variable; later layers win; every
bad name, file or value is refused in one line saying where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_bench.bench.run.config import BenchConfig
from compaction_bench.common.options import settings_from
from compaction_bench.common.settings import (
    SettingsError,
    build,
    layered,
    settings_of,
    settings_table,
)


def test_every_setting_has_its_three_names_derived_from_its_field() -> None:
    names = {s.key: s.variable for s in settings_of(BenchConfig)}
    assert names["regime"] == "REGIME" and names["stream_deadline_s"] == "STREAM_DEADLINE_S"
    assert names["sweep.levels"] == "SWEEP_LEVELS" and names["base_url"] == "BASE_URL"
    assert set(names) == {row[0] for row in settings_table(BenchConfig)}
    assert all(description for *_, description in settings_table(BenchConfig)), (
        "every setting says what it does")


def test_file_then_environment_then_words_each_override_the_one_before(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('regime = "overloaded"\nblocks = 4\narms = ["clean", "self"]\nseed = 1\n'
                   "[sweep]\nlevels = [1, 2]\n")
    env = {"BLOCKS": "3", "SEED": "", "COMPBENCH_SWEEP_WARMUP": "2", "UNRELATED": "x",
           "MAKEFLAGS": "s -- BLOCKS=3 SEED="}
    layers = layered(BenchConfig, file=run, env=env, words=["seed=7", "CACHE=run"])
    config = build(BenchConfig, layers, "bench settings")
    assert (config.regime, config.blocks, config.seed, config.cache) == ("overloaded", 3, 7, "run")
    assert config.arms == ("clean", "self") and config.sweep.levels == (1, 2)
    assert config.sweep.warmup == 2  # an empty variable (SEED=) leaves the setting unset
    assert layers.sources["blocks"] == "make BLOCKS"
    assert layers.sources["sweep.warmup"] == "environment COMPBENCH_SWEEP_WARMUP"
    assert layers.ignored == []
    assert layers.sources["seed"] == "command line" and layers.sources["regime"].startswith(
        "file ")
    # what the user gave is what a RESUME keeps; the rest comes from the resumed run
    assert {"regime", "blocks", "seed", "cache", "arms", "sweep"} <= config.model_fields_set


def test_a_platforms_own_variable_is_named_and_never_taken() -> None:
    # PORT and SEED set by a container platform, not given to make: the run keeps its defaults
    env = {"PORT": "5000", "SEED": "9", "TASK": "", "MAKEFLAGS": " -- REGIME=shared"}
    env["REGIME"] = "shared"
    layers = layered(BenchConfig, env=env)
    config = build(BenchConfig, layers, "bench settings")
    assert (config.port, config.seed, config.regime) == (8000, 0, "shared")
    assert len(layers.ignored) == 2 and all("\n" not in line for line in layers.ignored)
    assert any(line.startswith("environment PORT='5000' ignored") and "COMPBENCH_PORT" in line
               for line in layers.ignored), layers.ignored
    taken = layered(BenchConfig, env={"COMPBENCH_PORT": "5000"})
    assert build(BenchConfig, taken, "bench settings").port == 5000 and not taken.ignored


def test_text_for_a_tuple_is_split_at_commas_and_booleans_read_as_make_writes_them() -> None:
    config = settings_from(BenchConfig, "bench", words=[
        "arms=clean, external ,external-history", "FAST_START=1", "token_ids=0",
        "sweep.levels=4,1,2"])
    assert config.arms == ("clean", "external", "external-history")
    assert config.fast_start is True and config.token_ids is False
    assert config.sweep.levels == (1, 2, 4)


@pytest.mark.parametrize(("words", "file_text", "needle"), [
    (["regimes=x"], None, "'regimes=x': give settings as name=value with one of regime"),
    (["blocks"], None, "'blocks': give settings as name=value"),
    (["blocks=0"], None, "blocks: Input should be greater than 0 (got '0') (from command "
                         "line)"),
    ([], "regim = 1\n", "unknown setting 'regim'"),
    ([], "regime = \n", "not valid TOML"),
    ([], 'seed = "x"\n', "seed: Input should be a valid integer"),
])
def test_bad_settings_are_refused_naming_their_source(
        tmp_path: Path, words: list[str], file_text: str | None, needle: str) -> None:
    run = None
    if file_text is not None:
        run = tmp_path / "run.toml"
        run.write_text(file_text)
    with pytest.raises(SettingsError) as refused:
        settings_from(BenchConfig, "bench", words=words, file=run)
    message = str(refused.value)
    assert needle in message and "\n" not in message
    if run is not None:
        assert str(run) in message


def test_a_missing_settings_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"no-such\.toml: no such settings file"):
        settings_from(BenchConfig, "bench", words=[], file=tmp_path / "no-such.toml")
