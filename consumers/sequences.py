"""An episode's model calls as token sequences: one per conversation whose calls extend each other.

A multi-turn agent resends its context on every call, so call ``k+1``'s prompt begins with call ``k``'s prompt and
completion. Training on each call separately would train on the early completions again and again, as prompt
context; one sequence per conversation trains on each generated token exactly once:

- the sequence is the conversation's last call's prompt and completion;
- each call's completion sits at a known position in it (its prompt's length): the loss mask is 1 exactly there,
  so tool results, chat-template tokens and everything else the model did not generate are masked;
- a call continues the sequence only when its prompt begins with the whole current sequence (the definition the
  recording proxy uses for ``conversation_id``); any other call of the same conversation (a re-templated or
  compacted context, a retry) closes the sequence and starts a new one, so no token is ever attributed to the
  wrong position.

Calls of different conversations (a sub-agent, a summariser) are separate sequences; sequences are ordered by their
first call. Behaviour logprobs come from the calls' recorded ``completion_logprobs``, 0 outside completions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.trajectory import Step

TokenIds = npt.NDArray[np.int32]
Floats = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class CallSpan:
    """Where one call's completion sits in its sequence: tokens ``start`` to ``end`` (exclusive)."""

    call_index: int
    start: int
    end: int
    policy_version: int
    retokenized: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class TokenSequence:
    """One trainable sequence: token ids, per-token behaviour logprobs, and the calls' completion spans."""

    conversation_id: int
    token_ids: TokenIds
    logprobs: Floats  # behaviour logprob of each completion token; 0 elsewhere
    spans: tuple[CallSpan, ...]

    @property
    def first_call(self) -> int:
        """Call index of the first call in this sequence."""
        return self.spans[0].call_index

    @property
    def last_call(self) -> int:
        """Call index of the last call in this sequence."""
        return self.spans[-1].call_index

    @property
    def oldest_policy_version(self) -> int:
        """The oldest policy version among the calls that generated this sequence's completions."""
        return min(span.policy_version for span in self.spans)

    def completion_mask(self, *, include_retokenized: bool = True) -> npt.NDArray[np.uint8]:
        """1 on every completion token (optionally not on retokenized calls' tokens), 0 elsewhere."""
        mask = np.zeros(len(self.token_ids), dtype=np.uint8)
        for span in self.spans:
            if include_retokenized or not span.retokenized:
                mask[span.start : span.end] = 1
        return mask

    def header(self) -> dict[str, Any]:
        """The JSON-ready metadata (the arrays travel separately; see ``consumers.sample_state``)."""
        spans = [[s.call_index, s.start, s.end, s.policy_version, s.retokenized] for s in self.spans]
        return {"conversation_id": self.conversation_id, "length": len(self.token_ids), "spans": spans}

    @classmethod
    def from_header(cls, header: Mapping[str, Any], token_ids: TokenIds, logprobs: Floats) -> TokenSequence:
        """Rebuild a sequence from ``header()`` and its two arrays."""
        spans = tuple(CallSpan(c, s, e, v, bool(r)) for c, s, e, v, r in header["spans"])
        return cls(header["conversation_id"], token_ids, logprobs, spans)


def build_sequences(steps: Sequence[Step]) -> list[TokenSequence]:
    """The sequences of an episode's steps (in call order), ordered by their first call."""
    open_: dict[int, _Builder] = {}
    done: list[_Builder] = []
    for step in sorted(steps, key=lambda s: s.call_index):
        builder = open_.get(step.conversation_id)
        if builder is None or not builder.extends(step):
            if builder is not None:
                done.append(builder)
            builder = open_[step.conversation_id] = _Builder(step.conversation_id)
        builder.add(step)
    done.extend(open_.values())
    return [builder.build() for builder in sorted(done, key=lambda b: b.spans[0].call_index)]


class _Builder:
    """A sequence being built: the latest call's prompt and completion (the sequence is their concatenation, made
    once in ``build``: concatenating at every call would copy the growing context again and again) and the
    completion spans so far."""

    def __init__(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        self.prompt: TokenIds = np.zeros(0, dtype=np.int32)
        self.completion: TokenIds = np.zeros(0, dtype=np.int32)
        self.logprob_parts: list[tuple[int, Floats]] = []
        self.spans: list[CallSpan] = []

    def extends(self, step: Step) -> bool:
        """Whether ``step``'s prompt begins with the whole sequence so far."""
        prompt = np.asarray(step.prompt_token_ids)
        start, end = len(self.prompt), len(self.prompt) + len(self.completion)
        return len(prompt) >= end and _starts_with(prompt, self.prompt) and _equal(prompt[start:end], self.completion)

    def add(self, step: Step) -> None:
        start = len(step.prompt_token_ids)
        self.prompt = np.asarray(step.prompt_token_ids, dtype=np.int32)
        self.completion = np.asarray(step.completion_token_ids, dtype=np.int32)
        logprobs = np.asarray(step.completion_logprobs, dtype=np.float32)
        if len(logprobs) == len(self.completion):  # a retokenized call may carry none
            self.logprob_parts.append((start, logprobs))
        span = CallSpan(step.call_index, start, start + len(self.completion), step.policy_version, step.retokenized)
        self.spans.append(span)

    def build(self) -> TokenSequence:
        tokens = np.concatenate([self.prompt, self.completion])
        logprobs = np.zeros(len(tokens), dtype=np.float32)
        for start, part in self.logprob_parts:
            logprobs[start : start + len(part)] = part
        return TokenSequence(self.conversation_id, tokens, logprobs, tuple(self.spans))


def _starts_with(array: npt.NDArray[Any], prefix: TokenIds) -> bool:
    """Whether ``array`` begins with ``prefix``; without comparing when both are views of the same memory (the
    prompts ``orchard.prefix_delta.PromptReconstructor`` rebuilds share one buffer per conversation)."""
    if array.dtype == prefix.dtype and _address(array) == _address(prefix) and _contiguous(array, prefix):
        return True
    return _equal(array[: len(prefix)], prefix)


def _equal(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    """``np.array_equal`` for two 1-D arrays, without its overhead (a few microseconds per call, twice per call of
    an episode)."""
    return a.shape == b.shape and bool((a == b).all())


def _address(array: npt.NDArray[Any]) -> int:
    return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


def _contiguous(*arrays: npt.NDArray[Any]) -> bool:
    return all(a.flags.c_contiguous for a in arrays)
