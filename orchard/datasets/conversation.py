"""A chat conversation split into the model calls that produced it, tokenized with the policy's chat template.

Every assistant message is one model call. Its prompt is the messages before it rendered with the chat template
and the generation prompt, tokenized as the engine tokenizes a request (``encode(text, add_special_tokens=False)``);
its completion is the text the template adds for that assistant message, cut after the last end-of-turn token, as
an engine would have sampled it (the template's newline after ``<|im_end|>`` belongs to the next prompt).

Departure from tokenizing every prompt whole, and why: an agent trajectory resends its context on every call, so
encoding each prompt costs the square of the conversation's length. Texts are instead cut just after each special
token (``<|im_end|>``, ``<|im_start|>``...), where Hugging Face tokenizers split before any BPE, and each piece is
encoded once per trajectory. Whether this tokenizer really treats pieces independently is checked on every
trajectory against a whole encode of its last prompt and its longest text; on the first mismatch the tokenizer is
switched to whole encodes for good (exact, quadratic).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.datasets.exceptions import DatasetError, RowError
from orchard.logging import get_logger

log = get_logger("datasets.conversation")
TokenIds = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class SplitCall:
    """One model call recovered from a conversation."""

    messages: list[dict[str, Any]]
    prompt_ids: TokenIds
    completion_ids: TokenIds
    response_text: str
    tool_calls: list[Any]


class ChatTokenizer:
    """A Hugging Face tokenizer with a chat template, rendering and encoding as the local engine does."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        """Wrap ``tokenizer`` (a ``PreTrainedTokenizerBase`` with a chat template); ``name`` is for records/logs."""
        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError(f"tokenizer {name!r} has no chat template; imported text must be rendered with one")
        self.tokenizer = tokenizer
        self.name = name
        self.segmented = True
        specials = sorted({str(t) for t in tokenizer.all_special_tokens} | _added_specials(tokenizer), key=len)
        self._cut = re.compile("|".join(re.escape(t) for t in reversed(specials))) if specials else None
        eos = tokenizer.eos_token_id
        self._eos: frozenset[int] = frozenset([eos] if isinstance(eos, int) else eos or [])
        self._backend = _plain_backend(tokenizer)

    @classmethod
    def load(cls, spec: str) -> ChatTokenizer:
        """``tiny`` (the project's tiny tokenizer) or the path of a tokenizer directory (``AutoTokenizer``)."""
        if spec == "tiny":
            from orchard.engines.tiny import build_tiny_tokenizer

            return cls(build_tiny_tokenizer(), "tiny")
        if not Path(spec).is_dir():
            raise DatasetError(f"--tokenizer {spec!r}: not 'tiny' and not a tokenizer directory")
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(spec)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"--tokenizer {spec!r}: cannot load a tokenizer there: {exc}") from exc
        return cls(tokenizer, Path(spec).name)

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], generation_prompt: bool) -> str:
        """The chat template's text for ``messages`` (and ``tools``), with or without the generation prompt."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=list(tools) or None,
                add_generation_prompt=generation_prompt,
                tokenize=False,
            )
        except Exception as exc:  # jinja2 raises many types (TemplateError, TypeError, KeyError...)
            raise RowError(f"the chat template cannot render the conversation: {exc}", "ChatTemplateError") from exc
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the engine encodes a prompt (no special tokens added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of each text, in one call into a fast tokenizer's backend where that is the same thing."""
        if self._backend is None or not texts:
            return [self.encode(text) for text in texts]
        return [encoding.ids for encoding in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def split(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> list[SplitCall]:
        """One ``SplitCall`` per assistant message of ``messages``; raise ``RowError`` if it cannot be rendered."""
        turns = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
        if not turns:
            raise RowError("the conversation has no assistant message", "MalformedMessagesError")
        prompts, completions = zip(*(self._texts(messages, tools, index) for index in turns), strict=True)
        encoded = self.encode_many(completions)
        completion_ids = [self._completion(ids, index) for ids, index in zip(encoded, turns, strict=True)]
        prompt_ids = self._encode_prompts(list(prompts), prompts[-1] + completions[-1])
        return [
            SplitCall(
                messages=[dict(m) for m in messages[:index]],
                prompt_ids=np.asarray(prompt, dtype=np.int32),
                completion_ids=completion,
                response_text=_text_of(messages[index].get("content")),
                tool_calls=list(messages[index].get("tool_calls") or []),
            )
            for index, prompt, completion in zip(turns, prompt_ids, completion_ids, strict=True)
        ]

    def chat_trace_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], reply: Mapping[str, Any]
    ) -> tuple[list[int], list[int]]:
        """Prompt ids of ``messages`` and completion ids of the assistant ``reply``, as the policy's engine reports
        them (the scripted backend's ``TraceTokenizer``, so scripted demonstrations carry the policy's tokens)."""
        last = self.split([*messages, dict(reply)], tools)[-1]
        return last.prompt_ids.tolist(), last.completion_ids.tolist()

    def _texts(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], index: int) -> tuple[str, str]:
        prompt = self.render(messages[:index], tools, True)
        full = self.render(messages[: index + 1], tools, False)
        if not full.startswith(prompt):
            raise RowError(
                f"message {index}: the chat template does not render the assistant turn as a continuation of the "
                "generation prompt, so its tokens cannot be told apart from the prompt's",
                "ChatTemplateError",
            )
        return prompt, full[len(prompt) :]

    def _encode_prompts(self, prompts: list[str], longest: str) -> list[list[int]]:
        if not self.segmented:
            return self.encode_many(prompts)
        checked = [prompts[-1], longest]
        pieces = [self._pieces(text) for text in [*prompts, *checked]]
        unique = list(dict.fromkeys(piece for text in pieces for piece in text))
        table = dict(zip(unique, self.encode_many(unique), strict=True))
        joined = [[token for piece in text for token in table[piece]] for text in pieces]
        if joined[-2:] != self.encode_many(checked):
            log.warning("tokenizer does not encode pieces independently; prompts encoded whole", name=self.name)
            self.segmented = False
            return self.encode_many(prompts)
        return joined[: len(prompts)]

    def _completion(self, ids: list[int], index: int) -> TokenIds:
        ends = [i for i, token in enumerate(ids) if token in self._eos]
        if not ids:
            raise RowError(f"message {index}: the assistant turn renders to no tokens", "ChatTemplateError")
        return np.asarray(ids[: ends[-1] + 1] if ends else ids, dtype=np.int32)

    def _pieces(self, text: str) -> list[str]:
        if self._cut is None:
            return [text]
        bounds = [0, *(m.end() for m in self._cut.finditer(text)), len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _plain_backend(tokenizer: Any) -> Any:
    """A fast tokenizer's Rust backend when calling it directly encodes exactly as ``tokenizer.encode`` does."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    probe = "<|im_start|>user\nHello, world!  \n\tdef f(x): return x<|im_end|>\n"
    same = backend.encode(probe, add_special_tokens=False).ids == list(
        tokenizer.encode(probe, add_special_tokens=False)
    )
    return backend if same else None


def _added_specials(tokenizer: Any) -> set[str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {str(token) for token in decoder.values() if getattr(token, "special", False)}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""
