"""The package as a user installs it: a wheel holds one top-level package, `compaction_bench`,
with its shipped data, and from an empty folder the installed copy (not the checkout) answers
`--version` and reproduces the study's Table 12 (`report-study`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from compaction_bench.common.paths import repo_root

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(repo_root())],
                   check=True, capture_output=True, timeout=300)
    found = sorted(out.glob("compaction_bench-*.whl"))
    assert len(found) == 1, found
    return found[0]


def test_the_wheel_installs_one_top_level_package_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "compaction_bench", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for needed in ("compaction_bench/data/study/b300_blocks.json",
                   "compaction_bench/data/histories/study/"
                   "laguna-s-2.1__atcoder-abc400_b__rep-01__seed-1412000/external.json",
                   "compaction_bench/serve/profiles/cpu-tiny.toml",
                   "compaction_bench/bench/run/session.py"):
        assert needed in names, needed
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "compaction-bench = compaction_bench.cli:entry" in zipfile.ZipFile(wheel).read(
        entry).decode()


def test_the_installed_copy_reproduces_table_12_from_an_empty_folder(
        wheel: Path, tmp_path: Path) -> None:
    site, empty = tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("COMPBENCH_DATA", None)
    env.pop("COMPBENCH_RESULTS", None)
    where = subprocess.run(
        [sys.executable, "-c", "import compaction_bench; from compaction_bench.common.paths "
         "import data_root; print(compaction_bench.__file__); print(data_root())"],
        cwd=empty, env=env, capture_output=True, text=True, check=True, timeout=60)
    module, data = where.stdout.split()
    assert Path(module).is_relative_to(site) and Path(data).is_relative_to(site), where.stdout
    version = subprocess.run([sys.executable, "-m", "compaction_bench", "--version"], cwd=empty,
                             env=env, capture_output=True, text=True, timeout=60, check=True)
    assert version.stdout.startswith("compaction-bench ")
    done = subprocess.run([sys.executable, "-m", "compaction_bench", "study", "report"], cwd=empty,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((empty / "results" / "study-b300" / "summary.json").read_text())
    pooled = summary["pooled"]["arms"]
    assert round(pooled["self"]["paired_median_change_pct"], 2) == -25.40
    assert round(pooled["external"]["paired_median_change_pct"], 2) == -18.54
