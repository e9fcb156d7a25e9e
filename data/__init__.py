"""The suite's shipped data (task workspaces, history files, the study's records, the redaction
corpus), read through `importlib.resources` as `compaction_bench.data` (see README.md here)."""
