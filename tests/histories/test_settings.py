"""`histories acquire` and `histories arms` (what `make histories` runs) take their settings as
every command does (issue 31): `name=value` words, `--config`, make's command-line variables
and COMPBENCH_<NAME>, the known flags as aliases. In-process: nothing here starts a server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.settings import SettingsError, settings_of
from compaction_bench.histories.cli import app
from compaction_bench.histories.settings import AcquireConfig, ArmsConfig


def invoke(*args: str, env: dict[str, str] | None = None) -> str:
    cleared = {k: None for k in os.environ
               if k in ("MAKEFLAGS", "TASK", "ARMS") or k.startswith("COMPBENCH_")}
    result = CliRunner().invoke(app, list(args), env={**cleared, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize(("command", "model"), [("acquire", AcquireConfig),
                                                ("arms", ArmsConfig)])
def test_settings_lists_every_field(command: str, model: type[AcquireConfig | ArmsConfig]
                                    ) -> None:
    listed = invoke(command, "--settings").splitlines()
    assert [line.split()[:2] for line in listed] == [
        [s.key, s.variable] for s in settings_of(model)]


def test_a_word_a_flag_and_a_make_variable_name_the_same_task(tmp_path: Path) -> None:
    for args, env in ((("task=nope", f"root={tmp_path}"), {}),
                      (("--task", "nope", "--root", str(tmp_path)), {}),
                      (("--from-env",), {"MAKEFLAGS": f" -- TASK=nope ROOT={tmp_path}",
                                         "TASK": "nope", "ROOT": str(tmp_path)}),
                      (("--from-env", "task=other", "--task", "nope"),
                       {"COMPBENCH_ROOT": str(tmp_path)})):
        with pytest.raises(SuiteError, match=rf"no clean history at {tmp_path}/nope/clean\.json"):
            invoke("arms", *args, env=env)


def test_a_platforms_task_is_not_taken(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match=r"no clean history at .*/fix-median/clean\.json"):
        invoke("arms", "--from-env", f"root={tmp_path}", "task=fix-median",
               env={"TASK": "nope"})


@pytest.mark.parametrize(("words", "needle"), [
    (["prompt=verbose"], "prompt: Value error, unknown prompt 'verbose'; use one of telegraphic"),
    (["external_port=0"], "external_port: Input should be greater than or equal to 1"),
    (["arms="], None),  # empty: not given, the default arms stand (and the task is missing)
    (["armz=self"], "'armz=self': give settings as name=value with one of profile"),
])
def test_bad_arms_settings_are_refused_naming_the_setting(tmp_path: Path, words: list[str],
                                                          needle: str | None) -> None:
    if needle is None:
        with pytest.raises(SuiteError, match="no clean history"):
            invoke("arms", f"root={tmp_path}", *words)
        return
    with pytest.raises(SettingsError) as refused:
        invoke("arms", f"root={tmp_path}", *words)
    assert needle in str(refused.value) and "\n" not in str(refused.value)
