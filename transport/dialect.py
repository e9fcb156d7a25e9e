"""What a request asks of the engine beyond the OpenAI chat API, in one place: vLLM's extras.

The suite speaks OpenAI's chat completions to every server, plus a few fields only vLLM reads:

- `cache_salt`: requests with different salts share no prefix-cache blocks (each arm, block
  and background user gets its own, so caches are isolated exactly as the run says);
- a forced length: `max_tokens` with `ignore_eos` (and `min_tokens` to the same count where the
  count must be exact: a replayed turn at its recorded length);
- `return_token_ids`: the prompt's and completion's token ids come back (cache-break
  accounting);
- `skip_special_tokens` off: a generated special token still arrives as text, so every token
  is stamped (the device probes);
- `top_k`: a model card's sampling (Qwen3's top_k 20), which OpenAI's API lacks.

A second engine (SGLang), or vLLM's next rename of one of these, changes this file and nothing
else: every request body the suite builds takes these fields from here. The metrics the suite
reads from a server are named in one place too: `serve.endpoints.FIELDS`.
"""

from __future__ import annotations

from typing import Any

CACHE_SALT = "cache_salt"  # the request field, also the label background records carry


def cache_salt(salt: str | None) -> dict[str, Any]:
    """The field that isolates a request's prefix cache by `salt` (nothing where None)."""
    return {CACHE_SALT: salt} if salt else {}


def length(tokens: int, *, exact: bool = False) -> dict[str, Any]:
    """Generate `tokens` tokens whatever the model would stop at; `exact`: never fewer either."""
    return {"max_tokens": tokens, **({"min_tokens": tokens} if exact else {}),
            "ignore_eos": True}


def top_k(k: int | None) -> dict[str, Any]:
    """Sample from the `k` most likely tokens (a model card's top_k; nothing where None)."""
    return {"top_k": k} if k is not None else {}


def token_ids() -> dict[str, Any]:
    """Ask for the prompt's and the completion's token ids in the response."""
    return {"return_token_ids": True}


def special_tokens_as_text() -> dict[str, Any]:
    """Stream generated special tokens as text, so that every token has a timestamp."""
    return {"skip_special_tokens": False}
