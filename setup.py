"""The one import package, `compaction_bench`, built from the repository's stage folders.

The repository keeps each stage as a top-level folder (`serve/`, `bench/`, ...); this maps each
to `compaction_bench.<stage>`, so a wheel installs one top-level package and an editable install
imports the same names from the checkout. Everything else about the project is in pyproject.toml.
"""

from pathlib import Path
from runpy import run_path

from setuptools import find_namespace_packages, setup

# The folders that become subpackages (compaction_bench/stages.py, their one list, read without
# importing the package), and the shipped data (files, not code).
_stages = run_path(str(Path(__file__).parent / "compaction_bench" / "stages.py"))
STAGES = (*_stages["STAGES"], _stages["DATA"])

package_dir = {"compaction_bench": "compaction_bench"}
packages = ["compaction_bench"]
for stage in STAGES:
    package_dir[f"compaction_bench.{stage}"] = stage
    # every folder, data-only ones too (profiles/, results/, ...): their files are package data
    packages += [f"compaction_bench.{stage}",
                 *(f"compaction_bench.{stage}.{sub}" for sub in find_namespace_packages(
                     stage, exclude=["*__pycache__*"]) if sub.replace(".", "").isidentifier())]

setup(packages=packages, package_dir=package_dir)
