"""What a request left in the server's prefix cache, kept small: chained hashes of its token ids
in 16-token units, instead of the ids themselves.

vLLM (asked with `return_token_ids`) streams the rendered prompt's token ids in its first chunk
and each chunk's generated ids. The prefix cache hashes a prompt in KV blocks of B tokens, each
block's hash covering everything before it; every B vLLM uses (16, 32, 64, 128, 256) is a
multiple of 16, so the chained hash of every 16-token unit, taken over prompt then completion,
answers for any B: two token sequences share their first k·16 tokens exactly when their k-th
unit hashes are equal, and the shared length floored to B is what the cache can serve. A
request's `kv_prefix` label holds the unit, the prompt and completion lengths and the hashes
(8 hex digits each; a chance match at one position is 1 in 4·10^9), about 0.7 bytes per token.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence
from typing import Any

UNIT = 16


def unit_hashes(token_ids: Sequence[int], unit: int = UNIT) -> list[str]:
    """Hash k (from 0) covers tokens [0, (k+1)·unit): each is the hash of the previous one and
    its own unit's ids. A trailing partial unit gets no hash."""
    out: list[str] = []
    previous = b""
    for start in range(0, len(token_ids) - unit + 1, unit):
        ids = array("q", token_ids[start:start + unit]).tobytes()
        previous = hashlib.blake2b(previous + ids, digest_size=4).digest()
        out.append(previous.hex())
    return out


def prefix_label(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> dict[str, Any]:
    """The `kv_prefix` label of one request (module docstring)."""
    return {"unit": UNIT, "prompt": len(prompt_ids), "completion": len(completion_ids),
            "hashes": unit_hashes([*prompt_ids, *completion_ids])}


def common_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """How many leading items two sequences share: tokens of two prompts, or unit hashes of two
    requests (shared tokens = this x unit)."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
