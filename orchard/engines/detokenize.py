"""Incremental detokenization with stop strings, for streaming text as tokens are sampled.

Decoding token by token breaks multi-byte characters (a byte-level BPE token may hold half of one), so the text is
decoded over a sliding window (the "prefix offset / read offset" method of vLLM and TGI): a token's text is released
only once the window decodes without a trailing replacement character. Stop strings are searched in the text as it
grows; the text is cut just before the first one, and while generation runs the last ``longest stop - 1``
characters are held back, so streamed text never shows the start of a stop string it later removes.

Special tokens (end of turn, padding) are skipped in the text; the token ids themselves are kept by the caller.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class TokenDecoder(Protocol):
    """What detokenization needs of a tokenizer (a ``PreTrainedTokenizerFast`` is one)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str:
        """Text of ``token_ids``."""
        ...


class IncrementalDetokenizer:
    """Text of one sequence as its tokens arrive, with stop strings applied."""

    def __init__(self, tokenizer: TokenDecoder, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._text = ""
        self._released = 0
        self.stopped_by: str | None = None

    @property
    def text(self) -> str:
        """All text so far (cut before a stop string once one was found)."""
        return self._text

    def push(self, token_id: int) -> str:
        """Add one token; return the text that may be shown now (possibly empty)."""
        if self.stopped_by is not None:
            return ""
        self._ids.append(token_id)
        self._text += self._decode_new()
        self._find_stop()
        end = len(self._text) if self.stopped_by is not None else max(self._released, len(self._text) - self._hold)
        return self._release(end)

    def flush(self) -> str:
        """At the end of generation: the text held back so far."""
        return self._release(len(self._text))

    def _decode_new(self) -> str:
        window = self._ids[self._prefix_offset :]
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = self._tokenizer.decode(window, skip_special_tokens=True)
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            return ""  # an incomplete character, or a token with no text: wait for more
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def _find_stop(self) -> None:
        if not self._stop:
            return
        start = max(0, self._released - self._hold)
        hits = [(pos, s) for s in self._stop if (pos := self._text.find(s, start)) >= 0]
        if hits:
            pos, stop = min(hits)
            self._text = self._text[:pos]
            self.stopped_by = stop

    def _release(self, end: int) -> str:
        piece = self._text[self._released : end]
        self._released = max(self._released, end)
        return piece
