"""The compactor: one reasoning block and its requested action name in, one state record out,
through any OpenAI-compatible endpoint, under the study's rules.

Rules (Section 2, Appendix A.3, D.1), each pinned by a test in tests/compaction/:
- a block of at most 12 words stays identical (outcome `identity-short`, no request);
- the compressor sees only the raw block and the requested action's name: never an
  observation, never the pending tool result, never the tool's arguments;
- a draft that is not shorter in words reverts to the raw block (`reverted-not-shorter`),
  whatever else it holds (so it gets no repair: it would not be used);
- up to three drafts: an empty draft raises the completion cap for the next one (so does a
  shorter draft cut at the cap: a record without its tail is not a record); a shorter draft
  that drops a required candidate identifier or hard-threshold value gets one repair request
  with the raw text, the previous draft and the missing fields (if the repair fails, the first
  draft stands and the lexical diagnostics record what it lacks);
- each block is rewritten once: results are cached by (raw text, action name) within one
  compressor identity and prompt, in an append-only file shared by acquisition, arm writing and
  continuation. The identity is every setting that changes what a rewrite request returns
  (`CompressorConfig.identity`), so two arms share an entry only when they make the very same
  call (`self` and `self-every-3` on one compressor do: the cadence decides which blocks are
  rewritten, never what a block's rewrite request holds). An entry keeps the cost measured when
  it was made; a hit reports it as `cached` beside its own zero, so an arm written from hits
  states the rewrite's real cost, marked as from cache (an entry without one is not reused);
- an endpoint that is down or answers garbage (no chat completion, an echo of the prompt, a
  code fence in a text-protocol thought) yields `failed`: the block stays raw, the failure
  goes to the ledger, nothing is cached (a later run retries it).
An external compressor gets the block with secrets redacted (`redaction.py`); the originals are
put back into the record locally.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compaction_bench.common.files import append_jsonl, read_jsonl
from compaction_bench.common.timing import Clock, monotonic
from compaction_bench.histories.compaction.endpoint import (
    Completion,
    CompletionError,
    EndpointConfig,
    RecordSink,
    complete,
)
from compaction_bench.histories.compaction.ledger import Ledger, LedgerEntry, Outcome
from compaction_bench.histories.compaction.lexical import count_words, missing_required
from compaction_bench.histories.compaction.prompts import REWRITE_PROMPTS, Prompt, load_prompt
from compaction_bench.histories.compaction.redaction import Redacted, redact, restore
from compaction_bench.histories.format.history import canonical_json
from compaction_bench.histories.format.reasoning import (
    action_name,
    block_text,
    replace_block,
    thought_label,
)
from compaction_bench.serve.profile import Profile

IDENTITY_MAX_WORDS = 12
PAYLOAD_VERSION = 1  # the user-message layout below; recorded beside the prompt hash
_WRAPPING_FENCE_RE = re.compile(r"^```[\w-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)
_TURN_MARKERS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>")


class CompressorConfig(BaseModel):
    """One compressor: an endpoint, a frozen prompt, the draft budget, redaction and prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="arm-side label: 'self', 'external', ...")
    endpoint: EndpointConfig
    prompt: str = "telegraphic"
    max_tokens: int = Field(default=1024, gt=0, description="completion cap of the first draft")
    max_tokens_limit: int = Field(default=4096, gt=0, description="cap after empty drafts")
    max_tokens_per_raw_word: float | None = Field(
        default=None, gt=0, description="first cap = min(max_tokens, this x raw words + 32): a "
        "draft longer than the raw block reverts anyway, so a small CPU compressor that loops "
        "stops early (None: the study's fixed cap)")
    max_drafts: int = Field(default=3, ge=1, le=3)
    retry_temperature: float = Field(
        default=0.7, ge=0, description="sampling temperature of a draft that follows a rejected "
        "one (echo, code fence): the same request at temperature 0 would return the same draft")
    redact: bool = Field(default=True, description="redact secrets (required for external)")
    price_per_prompt_token: float | None = None
    price_per_completion_token: float | None = None
    cache_tag: str = Field(
        default="", description="the model that answers behind the endpoint's name (a "
        "profile's model.source); empty: the endpoint's URL stands for it in the cache identity")

    @property
    def identity(self) -> str:
        """What the cache keys a result by, besides raw text, action and prompt: the name, the
        served name, and a hash of every setting that changes what a rewrite request returns
        (which model answers: `cache_tag`, else the URL; sampling; draft caps and count;
        redaction; the payload layout). Not the deadline, the key's variable or the prices: they
        change whether and what a rewrite costs, not its record. Not the per-draft seed either:
        a block is rewritten once (the study's rule) and a continuation's seed changes per
        attempt; a temperature-0 first draft does not depend on it."""
        endpoint = self.endpoint
        shaping = {"served_by": self.cache_tag or endpoint.api_url, "model": endpoint.model,
                   "temperature": endpoint.temperature, "extra_body": endpoint.extra_body,
                   "max_tokens": self.max_tokens, "max_tokens_limit": self.max_tokens_limit,
                   "max_tokens_per_raw_word": self.max_tokens_per_raw_word,
                   "max_drafts": self.max_drafts, "retry_temperature": self.retry_temperature,
                   "redact": self.redact, "payload_version": PAYLOAD_VERSION}
        tag = f"#{self.cache_tag}" if self.cache_tag else ""
        return (f"{self.name}:{endpoint.model}{tag}"
                f"@{sha256_text(canonical_json(shaping))[:16]}")


def self_compressor(url: str, *, model: str = "compressor", **kwargs: Any) -> CompressorConfig:
    """The target model itself through the `compressor` name of its own server (no redaction:
    nothing leaves the server that already holds the history)."""
    return CompressorConfig(name="self", endpoint=EndpointConfig(api_url=url, model=model),
                            redact=False, **kwargs)


def external_compressor(url: str, *, model: str = "compressor",
                        api_key_env: str = "COMPRESSOR_API_KEY", **kwargs: Any) -> CompressorConfig:
    """Another endpoint and model; secrets are redacted before anything is sent."""
    return CompressorConfig(
        name="external",
        endpoint=EndpointConfig(api_url=url, model=model, api_key_env=api_key_env),
        redact=True, **kwargs)


def profile_compressor(name: str, url: str, profile: Profile, *, prompt: str,
                       per_word: float | None = None) -> CompressorConfig:
    """`self` or `external` served by a profile's own server at `url` (the one setup `make
    bench` and `histories arms` share): the profile's compressor name for self, its draft cap
    per raw word unless `per_word` overrides it, and the profile's model as the rewrite cache's
    identity, so a cached rewrite never hangs on a port."""
    make = self_compressor if name == "self" else external_compressor
    model = profile.model.compressor_name if name == "self" else "compressor"
    return make(url, model=model, prompt=prompt, max_tokens_per_raw_word=(
        per_word or profile.model.compressor_tokens_per_raw_word), cache_tag=profile.model.source)


@dataclass(frozen=True)
class CompactionResult:
    """One block's compaction: `record` is what the arm's history carries (the raw block for
    every outcome but `rewritten`)."""

    raw: str
    record: str
    action: str
    outcome: Outcome
    block_sha256: str
    words_in: int
    words_out: int
    drafts: int
    latency_s: float
    cache_hit: bool
    redactions: int
    repaired: bool
    missing_required: list[str]
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost: float | None
    error: str | None
    # a cache hit: the cost measured when the entry was made (latency_s, drafts, tokens, cost,
    # at, where); this call's own fields above stay 0. None: not a hit.
    cached: dict[str, Any] | None = None

    def provenance(self) -> dict[str, Any]:
        """The per-block part of an arm's provenance (no raw text: the clean arm has it)."""
        data = asdict(self)
        data.pop("raw")
        return data


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class CompactionCache:
    """(raw text, action, compressor identity, prompt hash) -> accepted record and the cost
    measured when it was made (`measured`), as an append-only JSONL file. Lines already written
    are never rewritten (a later line for the same key wins); a torn last line from a crash is
    ignored. Only settled outcomes are cached, never failures."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path is not None:
            for entry in read_jsonl(self.path).objects:
                if isinstance(entry.get("key"), str):
                    self._entries[entry["key"]] = entry

    @staticmethod
    def key(raw: str, action: str, compressor: str, prompt_sha256: str, fence_free: bool) -> str:
        return sha256_text(canonical_json([raw, action, compressor, prompt_sha256, fence_free]))

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        entry = {"key": key, **entry}
        with self._lock:
            self._entries[key] = entry
            if self.path is not None:
                append_jsonl(self.path, entry)

    def __len__(self) -> int:
        return len(self._entries)


def payload(block: str, action: str) -> str:
    """The user message of a rewrite request: the action name and the block, nothing else."""
    return f"Requested action: {action}\n\nRaw scratchpad:\n{block}"


def repair_payload(block: str, action: str, draft: str, missing: list[str]) -> str:
    """Appendix A.3's repair request: raw text, previous draft and the required fields."""
    return (f"{payload(block, action)}\n\nPrevious draft:\n{draft}\n\nThe previous draft dropped "
            f"required values. Rewrite it again, keeping each of these exactly: "
            f"{', '.join(missing)}")


def clean_draft(text: str) -> str:
    """Strip what is not part of a state record: surrounding whitespace, turn markers a chat
    template leaked, and a code fence wrapped around the whole draft."""
    for marker in _TURN_MARKERS:
        text = text.replace(marker, "")
    text = text.strip()
    wrapped = _WRAPPING_FENCE_RE.match(text)
    return wrapped.group(1).strip() if wrapped else text


class Compactor:
    """Rewrites blocks through one compressor, with a cache and a ledger. Thread-safe enough for
    one policy per arm; the cache and ledger may be shared between compactors.

    `on_record` receives the record of every compressor request (the bench writes them to the
    run's requests.jsonl); `origin_s` is the run's clock origin, so ledger lines carry `t_s` on
    the run's clock; `seed` is the base sampling seed of this compactor's drafts;
    `before_request` runs before every compressor request (a compressor server started on first
    use); the time it takes is kept in `waited_s`, apart from rewrite latency.
    """

    def __init__(self, config: CompressorConfig, *, cache: CompactionCache | None = None,
                 ledger: Ledger | None = None, clock: Clock = monotonic,
                 on_record: RecordSink | None = None, origin_s: float = 0.0,
                 seed: int | None = None,
                 before_request: Callable[[], None] | None = None) -> None:
        if config.prompt not in REWRITE_PROMPTS:
            raise ValueError(f"{config.prompt!r} is not a rewrite prompt; use one of "
                             f"{', '.join(REWRITE_PROMPTS)}")
        self.config = config
        self.prompt: Prompt = load_prompt(config.prompt)
        self.cache = cache if cache is not None else CompactionCache()
        self.ledger = ledger if ledger is not None else Ledger()
        self.clock = clock
        self.on_record = on_record
        self.origin_s = origin_s
        self.seed = seed if seed is not None else config.endpoint.seed
        self.before_request = before_request
        self.waited_s = 0.0

    def describe(self) -> dict[str, Any]:
        """What an arm's provenance records about its compressor (no API key)."""
        return {"name": self.config.name, "identity": self.config.identity,
                "endpoint": self.config.endpoint.model_dump(mode="json"),
                "prompt": self.prompt.name, "prompt_sha256": self.prompt.sha256,
                "payload_version": PAYLOAD_VERSION, "max_tokens": self.config.max_tokens,
                "max_tokens_limit": self.config.max_tokens_limit,
                "max_tokens_per_raw_word": self.config.max_tokens_per_raw_word,
                "max_drafts": self.config.max_drafts, "redact": self.config.redact,
                "identity_max_words": IDENTITY_MAX_WORDS}

    def compact(self, raw: str, action: str, *, fence_free: bool = False,
                context: dict[str, Any] | None = None) -> CompactionResult:
        """Compact one block. Never raises for endpoint trouble (that is outcome `failed`).

        `fence_free`: the record must hold no code fence (a text-protocol thought, where a
        fence would become a second action); a draft with one counts as a failed draft.
        """
        words_in = count_words(raw)
        if words_in <= IDENTITY_MAX_WORDS:
            return self._settle(raw, action, raw, "identity-short", context=context)
        key = CompactionCache.key(raw, action, self.config.identity, self.prompt.sha256,
                                  fence_free)
        hit = self.cache.get(key)
        # An entry without its measured cost is rewritten again rather than reused: a hit
        # without one would put a rewrite cost of 0 into the arm's T_R as if measured.
        if hit is not None and isinstance(hit.get("measured"), dict):
            return self._settle(raw, action, hit["record"], hit["outcome"], cache_hit=True,
                                drafts=0, context=context,
                                missing=list(hit.get("missing_required", [])),
                                redactions=int(hit.get("redactions", 0)),
                                cached=hit["measured"])
        result = self._rewrite(raw, action, fence_free=fence_free, context=context)
        if result.outcome != "failed":
            where = {k: v for k, v in (context or {}).items() if k in ("task", "arm", "phase")}
            self.cache.put(key, {"record": result.record, "outcome": result.outcome,
                                 "block_sha256": result.block_sha256, "action": action,
                                 "compressor": self.config.identity,
                                 "prompt_sha256": self.prompt.sha256,
                                 "missing_required": result.missing_required,
                                 "redactions": result.redactions, "at": time.time(),
                                 "measured": {
                                     "latency_s": result.latency_s, "drafts": result.drafts,
                                     "prompt_tokens": result.prompt_tokens,
                                     "completion_tokens": result.completion_tokens,
                                     "reasoning_tokens": result.reasoning_tokens,
                                     "at": time.time(), "where": where}})
        return result

    def _rewrite(self, raw: str, action: str, *, fence_free: bool,
                 context: dict[str, Any] | None) -> CompactionResult:
        sent = redact(raw) if self.config.redact else Redacted(raw, ())
        user = payload(sent.text, action)
        cap, repaired = self.config.max_tokens, False
        if self.config.max_tokens_per_raw_word is not None:
            cap = min(cap, int(self.config.max_tokens_per_raw_word * count_words(raw)) + 32)
        first: tuple[str, list[str]] | None = None  # a draft kept in case the repair fails
        drafts: list[Completion] = []
        error: str | None = None
        draft: str | None = None
        endpoint = self.config.endpoint
        for number in range(self.config.max_drafts):
            seed = None if self.seed is None else self.seed + number
            if self.before_request is not None:
                waited = self.clock()
                self.before_request()
                self.waited_s += self.clock() - waited
            try:
                got = complete(endpoint, self._messages(user), max_tokens=cap, clock=self.clock,
                               seed=seed, on_record=self.on_record)
            except CompletionError as exc:
                error = str(exc)
                continue
            drafts.append(got)
            text = clean_draft(got.text)
            if not text:  # a reasoning compressor spent the cap thinking: raise it
                error = f"empty draft (finish_reason {got.finish_reason}, cap {cap} tokens)"
                cap = min(cap * 2, self.config.max_tokens_limit)
                continue
            local, _ = restore(text, sent)
            if count_words(local) >= count_words(raw):
                if first is not None:  # a repair that is not shorter: the first draft stands
                    error = "repair draft not shorter; the first draft stands"
                    break
                draft, error = local, None  # not shorter: reverts, whatever else it holds
                break
            if got.finish_reason == "length":  # a shorter record cut at the cap lacks its tail
                error = f"truncated draft (cap {cap} tokens)"
                cap = min(cap * 2, self.config.max_tokens_limit)
                continue
            if self.prompt.text[:80] in text:
                error = "draft echoes the rewrite prompt (a model that does not follow it)"
                endpoint = self._resample(endpoint)
                continue
            if fence_free and "```" in text:
                error = "draft contains a code fence (it would become a second action)"
                endpoint = self._resample(endpoint)
                continue
            missing = missing_required(raw, local)
            if missing and not repaired:
                repaired, first = True, (local, missing)
                user = repair_payload(sent.text, action, text, missing)
                error = f"draft dropped required fields: {', '.join(missing)}"
                continue
            draft, error = local, None
            break
        if draft is None and first is not None:
            draft, error = first[0], None  # the repair did not come back usable: keep draft 1
        if draft is None:
            return self._settle(raw, action, raw, "failed", drafts=len(drafts) or
                                self.config.max_drafts, completions=drafts, error=error,
                                redactions=sent.count, repaired=repaired, context=context)
        outcome: Outcome = "rewritten" if count_words(draft) < count_words(raw) else (
            "reverted-not-shorter")
        record = draft if outcome == "rewritten" else raw
        return self._settle(raw, action, record, outcome, drafts=len(drafts), completions=drafts,
                            redactions=sent.count, repaired=repaired, context=context,
                            missing=missing_required(raw, record), draft_words=count_words(draft))

    def _resample(self, endpoint: EndpointConfig) -> EndpointConfig:
        """The endpoint for the draft after a rejected one: sampled, not greedy (at temperature 0
        the identical request returns the identical draft). The seed still advances per draft."""
        if endpoint.temperature >= self.config.retry_temperature:
            return endpoint
        return endpoint.model_copy(update={"temperature": self.config.retry_temperature})

    def _price(self, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
        pp, cp = self.config.price_per_prompt_token, self.config.price_per_completion_token
        if pp is None and cp is None:
            return None
        return (prompt_tokens or 0) * (pp or 0.0) + (completion_tokens or 0) * (cp or 0.0)

    def _messages(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.prompt.text},
                {"role": "user", "content": user}]

    def _settle(self, raw: str, action: str, record: str, outcome: Outcome, *,
                cache_hit: bool = False, drafts: int = 0,
                completions: list[Completion] | None = None, error: str | None = None,
                redactions: int = 0, repaired: bool = False, missing: list[str] | None = None,
                draft_words: int | None = None, context: dict[str, Any] | None = None,
                cached: dict[str, Any] | None = None) -> CompactionResult:
        done = completions or []

        def total(name: str) -> int | None:
            values = [getattr(c, name) for c in done]
            return sum(v for v in values if v is not None) if any(
                v is not None for v in values) else (None if done else 0)

        prompt_tokens, completion_tokens = total("prompt_tokens"), total("completion_tokens")
        cost = self._price(prompt_tokens, completion_tokens)
        if cached is not None:  # priced now, from the tokens measured then
            cached = {**cached, "cost": self._price(cached.get("prompt_tokens"),
                                                    cached.get("completion_tokens"))}
        result = CompactionResult(
            raw=raw, record=record, action=action, outcome=outcome,
            block_sha256=sha256_text(raw), words_in=count_words(raw),
            words_out=count_words(record), drafts=drafts,
            latency_s=sum(c.latency_s for c in done), cache_hit=cache_hit,
            redactions=redactions, repaired=repaired, missing_required=missing or [],
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            reasoning_tokens=total("reasoning_tokens"), cost=cost, error=error, cached=cached)
        extra = dict(context or {})
        if cached is not None:
            extra["from_cache"] = cached
        if draft_words is not None and outcome == "reverted-not-shorter":
            extra["draft_words"] = draft_words
        self.ledger.append(LedgerEntry(
            at=time.time(), t_s=self.clock() - self.origin_s,
            block_sha256=result.block_sha256, action=action,
            compressor=self.config.identity, prompt=self.prompt.name,
            prompt_sha256=self.prompt.sha256, words_in=result.words_in,
            words_out=result.words_out, outcome=outcome, latency_s=result.latency_s,
            drafts=drafts, cache_hit=cache_hit, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, reasoning_tokens=result.reasoning_tokens,
            cost=cost, redactions=redactions, repaired=repaired,
            missing_required=result.missing_required, error=error, context=extra))
        return result


def compact_message(compactor: Compactor, message: dict[str, Any], reasoning_mode: str,
                    protocol: str, *, context: dict[str, Any] | None = None,
                    ) -> tuple[dict[str, Any], CompactionResult | None]:
    """Compact one assistant message's reasoning block; (message to send, result). An empty
    block is left alone without a ledger line (the study compacts nonempty blocks only)."""
    block = block_text(message, reasoning_mode, protocol)
    if not block.strip():
        return message, None
    label, body = thought_label(block) if reasoning_mode != "native" else ("", block)
    result = compactor.compact(body, action_name(message, protocol),
                               fence_free=protocol == "text" and reasoning_mode != "native",
                               context=context)
    record = block if result.outcome != "rewritten" else (
        label + thought_label(result.record)[1] if label else result.record)
    return replace_block(message, record, reasoning_mode, protocol), result
