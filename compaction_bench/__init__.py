"""compaction-bench: does compacting an agent's old reasoning make it finish sooner, and how many
GPUs does a fleet then need, on your GPU, model and load?

One import package whose subpackages are the design's stages (`serve`, `histories`, `loadgen`,
`bench`, `plan`, `kernels`), what they share (`common`, `transport`) and the shipped data
(`data`). The repository keeps each stage as a top-level folder; the packaging maps them here
(setup.py), so an installed wheel holds this one top-level package.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("compaction-bench")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
