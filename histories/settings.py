"""The settings of `histories acquire` and `histories arms` (what `make histories` runs), given
as every command's are (common/options.py): `name=value` words, `--config`, make's
command-line variables and COMPBENCH_<NAME>, with the flags users know as aliases."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compaction_bench.common.net import DEFAULT_PORT
from compaction_bench.histories.compaction.arms import SEED_ARMS
from compaction_bench.histories.compaction.judge import GATES
from compaction_bench.histories.compaction.prompts import REWRITE_PROMPTS
from compaction_bench.histories.policies.registry import POLICY_ARMS
from compaction_bench.serve.profile import EXTERNAL_COMPRESSOR_PROFILE
from compaction_bench.serve.settings import ServerTarget

# `make histories` writes every arm the bench knows by a fixed name, plus the paper's random-30
# and a compaction cadence of three turns.
DEFAULT_ARMS = (*SEED_ARMS, *POLICY_ARMS, "self-every-3")


class _Target(ServerTarget):
    task: str = Field(default="all", description="task id, or 'all' for every runnable task")


class AcquireConfig(_Target):
    """`histories acquire`: the agent run to each task's fork."""

    seed: int = Field(default=0, ge=0, description="the agent's sampling seed")
    fork_turn: int | None = Field(default=None, ge=1, description="override the task's fork "
                                  "turn")
    out: Path | None = Field(default=None, description="history files' root (default: "
                             "data/histories, or $COMPBENCH_HISTORIES)")


class ArmsConfig(_Target):
    """`histories arms`: each arm's file beside each task's clean.json."""

    root: Path | None = Field(default=None, description="history files' root (default: "
                              "data/histories, or $COMPBENCH_HISTORIES)")
    arms: tuple[str, ...] = Field(default=DEFAULT_ARMS, min_length=1, description="arm names, "
                                  "comma-separated (clean and placebo need no file and are "
                                  "skipped)")
    external_profile: str = Field(default=EXTERNAL_COMPRESSOR_PROFILE, description="the "
                                  "embedded external compressor's profile")
    external_port: int = Field(default=DEFAULT_PORT + 1, ge=1, le=65535, description="its port")
    external_url: str | None = Field(default=None, description="an external compressor's URL "
                                     "instead (key from $COMPRESSOR_API_KEY)")
    external_model: str = Field(default="compressor", description="the model name to ask at "
                                "external_url")
    prompt: str = Field(default="telegraphic", description="the rewrite prompt: one of "
                        + ", ".join(REWRITE_PROMPTS))
    cap_per_word: float | None = Field(
        default=None, gt=0, description="first draft cap = this x raw words + 32 tokens "
        "(default: the compressor profile's compressor_tokens_per_raw_word, 2.0 on the embedded "
        "CPU models; for an external_url, the study's fixed cap)")
    judge_url: str | None = Field(default=None, description="fidelity judge URL")
    judge_model: str = Field(default="judge", description="the judge's model name")
    gate: str = Field(default="off", description="fidelity gate: one of " + ", ".join(GATES))
    scorer: str | None = Field(
        default=None, description="the entropy arms' proxy model: a local folder, a cached "
        "Hugging Face id or embedded:<name> (default: the profile's model.scorer; on CPU the "
        "served model)")
    scorer_device: str = Field(default="auto", description="auto, cpu, cuda, cuda:1, ...")
    seed: int = Field(default=0, ge=0, description="seed of random-<r> at the fork")

    @field_validator("prompt")
    @classmethod
    def _known_prompt(cls, prompt: str) -> str:
        if prompt not in REWRITE_PROMPTS:
            raise ValueError(f"unknown prompt {prompt!r}; use one of "
                             f"{', '.join(REWRITE_PROMPTS)}")
        return prompt


class AuditConfig(ServerTarget):
    """`histories audit`: two consecutive requests of a history through the server's
    /tokenize."""

    model: str = Field(default="target", description="the served model name to render with")
    json_out: bool = Field(default=False, description="print the audit as JSON")


class ContinueConfig(ServerTarget):
    """`histories continue`: a saved history continued from its fork by a live agent."""

    seed: int = Field(default=0, ge=0, description="the agent's sampling seed")
    step_limit: int | None = Field(default=None, ge=1, description="at most this many agent "
                                   "steps (default: the task's)")


class ImportConfig(BaseModel):
    """`histories import`: an agent's log as a history."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str | None = Field(default=None, description="the task id to give it "
                             "(default: the one the importer reads from the log)")
    fork: int | None = Field(default=None, ge=0, description="the fork: an index into all "
                             "messages of the file, counted from 0 (default: the last action "
                             "whose result was recorded)")


class ImportStudyConfig(BaseModel):
    """`study import`: the study's records as histories."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path | None = Field(default=None, description="history files' root (default: "
                             "data/histories, or $COMPBENCH_HISTORIES)")
