"""Incremental detokenization: multi-byte characters, special tokens and stop strings."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from orchard.engines.detokenize import IncrementalDetokenizer
from orchard.engines.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tiny_tokenizer()


def _stream(tokenizer: PreTrainedTokenizerFast, ids: list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tokenizer, stop)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return pieces, detok.text


def test_multibyte_characters_are_released_whole(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "naïve café — 東京 🍎 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) / 2  # byte-level pieces split the characters
    pieces, final = _stream(tokenizer, ids)
    assert final == text
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_special_tokens_have_no_text(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("hi", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert _stream(tokenizer, ids)[1] == "hi"


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (("STOP",), "The answer is 42. "),
        (("42", "answer"), "The "),
        (("absent",), "The answer is 42. STOP and more"),
        (("is 4",), "The answer "),
    ],
)
def test_stop_strings_cut_the_text_and_are_never_streamed(
    tokenizer: PreTrainedTokenizerFast, stop: tuple[str, ...], expected: str
) -> None:
    ids = tokenizer.encode("The answer is 42. STOP and more", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop)
    pieces = []
    for i in ids:
        pieces.append(detok.push(i))
        if detok.stopped_by is not None:
            break
    pieces.append(detok.flush())
    assert (detok.text, "".join(pieces)) == (expected, expected)
    assert (detok.stopped_by is not None) == (stop != ("absent",))
