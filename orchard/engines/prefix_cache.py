"""A prefix cache for the local engine: the keys and values of finished sequences, reused by later prompts that
begin with the same tokens.

An agent's calls repeat themselves: every episode's first prompt opens with the same system prompt and tool list,
and each later call of an episode is the previous call's prompt, its answer and a tool result. Without a cache each
call prefills its whole prompt (on the file-lookup recipe ~700 tokens a call, three quarters of the tiny engine's
work). With it a prompt is prefilled from where its longest common prefix with a remembered sequence ends.

What makes reuse exact: a causal model's key and value at position ``i`` depend on tokens ``0..i`` alone, and the
batch (``orchard.engines.kv_batch``) gives every token its real position whatever the padding, so the first ``n``
columns of a remembered sequence are what a fresh prefill of those ``n`` tokens would compute (up to floating-point
summation order). A cache belongs to one set of weights: the scheduler keeps one per cohort, so a new policy
version starts empty.

Entries are whole sequences (prompt and the answer tokens fed back), least recently used first out once the bytes
held pass ``max_bytes`` (a budget in bytes, not tokens: a token's keys and values weigh 8 KB on the tiny model and
half a megabyte on a 7B model without grouped-query attention); a sequence that extends a remembered one replaces it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

KV = tuple[torch.Tensor, torch.Tensor]
MIN_REUSE_TOKENS = 16
"""Shorter common prefixes are prefilled again: copying their keys costs about what computing them does."""


@dataclass(frozen=True)
class PrefixHit:
    """A prompt's reusable prefix: its length and each layer's keys and values, shaped (1, heads, length, dim)."""

    length: int
    layers: list[KV]


class PrefixCache:
    """Remembered sequences of one model's weights; ``lookup`` finds the longest reusable prefix of a prompt."""

    def __init__(self, max_bytes: int, min_reuse: int = MIN_REUSE_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse
        self.tokens_held = 0
        self.bytes_held = 0
        self._entries: OrderedDict[int, tuple[np.ndarray, list[KV], int]] = OrderedDict()
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> PrefixHit | None:
        """The longest prefix of ``prompt`` some entry shares (leaving at least its last token to compute)."""
        if not self._entries or len(prompt) <= self.min_reuse:
            return None
        wanted = np.asarray(prompt, dtype=np.int64)
        best_key, best = -1, 0
        for key, (tokens, _, _) in self._entries.items():
            shared = _common_prefix(tokens, wanted)
            if shared > best:
                best_key, best = key, shared
        best = min(best, len(prompt) - 1)  # the last prompt token must run: its logits pick the first answer token
        if best < self.min_reuse:
            return None
        self._entries.move_to_end(best_key)
        layers = self._entries[best_key][1]
        return PrefixHit(best, [(k[:, :, :best], v[:, :, :best]) for k, v in layers])

    def remember(self, tokens: list[int], layers: list[KV]) -> None:
        """Keep a sequence's keys and values (``layers`` shaped (1, heads, len(tokens), dim), owned by the cache)."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if len(tokens) < self.min_reuse or size > self.max_bytes:
            return
        ids = np.asarray(tokens, dtype=np.int64)
        for key, (held, _, _) in list(self._entries.items()):
            if len(held) <= len(ids) and _common_prefix(held, ids) == len(held):  # the new one covers it
                self._drop(key)
        self._entries[self._next_key] = (ids, layers, size)
        self._next_key += 1
        self.tokens_held += len(ids)
        self.bytes_held += size
        while self.bytes_held > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        tokens, _, size = self._entries.pop(key)
        self.tokens_held -= len(tokens)
        self.bytes_held -= size


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    >>> _common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5]))
    2
    """
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
