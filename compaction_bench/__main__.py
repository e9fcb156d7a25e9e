"""`python -m compaction_bench`: the same as the `compaction-bench` command."""

from compaction_bench.cli import entry

entry()
