"""The package's stages, the one list of them: each is a top-level folder of the repository
mapped to `compaction_bench.<stage>` (setup.py), in import order: a stage imports only those
before it (tests/common/test_layering.py holds every import to that). `data` is shipped files,
not code. The mypy view (.ci/package-view) links every folder with an `__init__.py`, which the
layering test keeps equal to these."""

STAGES = ("common", "transport", "serve", "kernels", "histories", "loadgen", "bench", "plan")
DATA = "data"
