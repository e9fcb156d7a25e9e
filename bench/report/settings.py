"""The settings of `report`, `compare` and `report-study`, given as every command's are
(common/options.py): `name=value` words, `--config`, make's command-line variables and
COMPBENCH_<NAME>, with the flags users know (`--seed`, `--out`) as aliases."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class ReportConfig(BaseModel):
    """`report RUN_DIR`: a run folder's report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, ge=0, description="seed of the bootstrap resampling")


class CompareConfig(ReportConfig):
    """`compare RUN_DIR...`: runs side by side."""

    out: Path | None = Field(default=None, description="write the comparison Markdown here "
                             "instead of printing it")


class StudyReportConfig(ReportConfig):
    """`report-study`: the study's own B300 blocks as a run folder."""

    source: Path | None = Field(default=None, description="the study's b300_blocks.json "
                                "(default: data/study/b300_blocks.json)")
    out: Path | None = Field(default=None, description="run folder to write (default: "
                             "results/study-b300)")
