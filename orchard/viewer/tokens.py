"""How token ids are shown: as text through the tiny tokenizer when the run's model is a tiny one, else as ids.

A run of another model names its checkpoint, whose tokenizer may be large or absent here, so the viewer does not
guess: it shows ids (``mode="ids"``). Each token is decoded on its own (``decode([id])``), so what a span shows is
exactly what that one recorded id stands for; a byte-level token holding part of a multi-byte character shows the
replacement character.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TokenMode = Literal["auto", "tiny", "ids"]


@dataclass
class TokenText:
    """Text of single tokens in ``mode`` ``"tiny"`` (decoded) or ``"ids"`` (none: the page shows the ids)."""

    mode: Literal["tiny", "ids"]
    _cache: dict[int, str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def for_run(cls, mode: TokenMode, recipe_model: str | None) -> TokenText:
        """``mode``, with ``"auto"`` meaning tiny when the recipe's model is a tiny-family name."""
        if mode == "auto":
            return cls("tiny" if recipe_model is not None and _is_tiny(recipe_model) else "ids")
        return cls(mode)

    def texts(self, ids: Sequence[int]) -> list[str] | None:
        """The text of each token id, or None in ``"ids"`` mode."""
        if self.mode == "ids":
            return None
        with self._lock:
            missing = {i for i in ids if i not in self._cache}
            if missing:
                tokenizer = _tiny_tokenizer()
                self._cache.update({i: tokenizer.decode([i]) for i in missing})
            return [self._cache[i] for i in ids]


def _is_tiny(model: str) -> bool:
    return model.startswith("tiny-")


@functools.cache
def _tiny_tokenizer() -> Any:
    from orchard.engines.tiny import build_tiny_tokenizer  # torch and transformers: only when tokens are shown

    return build_tiny_tokenizer()
