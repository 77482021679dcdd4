"""Prefix-delta encoding of prompts, so an episode's ModelCall bytes grow linearly with its length, not quadratically.

A multi-turn agent resends its whole context on every call. A ModelCall therefore stores its prompt as "the first
``prompt_prefix_length`` tokens of the full sequence (prompt + completion) of call ``prompt_base_call_index`` in the
same episode, followed by ``prompt_token_ids``". The producer (``PrefixDeltaEncoder``, one per episode) picks the
remembered call sharing the longest common prefix; the consumer (``PromptReconstructor``) rebuilds exact prompts.

Departures from the obvious scheme, and why:

- a remembered call whose whole sequence begins the new call's sequence is forgotten by the encoder: the new call
  shares at least as long a prefix with any later prompt, so nothing is lost, and a linear conversation keeps one
  candidate instead of all of them;
- the encoder remembers at most ``max_candidates`` calls (the most recent), bounding its memory and its per-call cost
  in a proxy serving thousands of episodes; an older branch point then costs a longer delta, never a wrong prompt.

The request's messages are delta encoded the same way, against the same base call: the first
``request_messages_prefix_count`` messages are the base call's conversation (its messages, then its reply as
``assistant_message`` builds it), and only the rest are stored. A harness that echoes the reply differently just
gets a shorter message prefix, never a wrong one.

Records must reach the consumer in the order they were encoded (one partition per episode keeps that order), since
a call's base is always a call encoded before it; call indices themselves need not arrive in order.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from orchard.serialization_errors import MissingBaseCallError, PrefixDeltaError
from orchard.tokens import unpack_token_ids

TokenArray = npt.NDArray[np.int32]
TokenInput = Sequence[int] | npt.NDArray[np.integer[Any]]


@dataclass(frozen=True, slots=True, eq=False)
class PromptDelta:
    """How one prompt is stored: ``base[:prefix_length] + new_token_ids``, or all of it when ``base_call_index`` is
    None (then ``prefix_length`` is 0)."""

    base_call_index: int | None
    prefix_length: int
    new_token_ids: TokenArray
    messages_prefix_count: int = 0
    new_messages: list[Any] | None = None


Message = Mapping[str, Any]


def assistant_message(response_text: str, tool_calls: Sequence[Any] = ()) -> dict[str, Any]:
    """The assistant message a chat harness appends after a response; the base of the next call's messages."""
    message: dict[str, Any] = {"role": "assistant", "content": response_text}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    return message


def common_message_prefix(base: Sequence[Any], messages: Sequence[Any]) -> int:
    """Number of leading messages two conversations share."""
    count = 0
    for old, new in zip(base, messages, strict=False):
        if old != new:
            break
        count += 1
    return count


def common_prefix_length(a: TokenArray, b: TokenArray) -> int:
    """Length of the longest common prefix of two token arrays (vectorised)."""
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if mismatches.size else n


class PrefixDeltaEncoder:
    """Producer side, one per episode: encodes each call's prompt against the calls it remembers."""

    def __init__(self, max_candidates: int = 8) -> None:
        """Remember at most ``max_candidates`` earlier calls (the most recent) as possible bases."""
        if max_candidates < 1:
            raise ValueError("max_candidates must be at least 1")
        self._max_candidates = max_candidates
        self._sequences: OrderedDict[int, TokenArray] = OrderedDict()
        self._conversations: dict[int, list[Any]] = {}
        self._encoded: set[int] = set()

    def encode(
        self,
        call_index: int,
        prompt_ids: TokenInput,
        completion_ids: TokenInput,
        messages: Sequence[Any] | None = None,
        reply: Message | None = None,
    ) -> PromptDelta:
        """Encode the prompt (and, if given, the request ``messages``) of call ``call_index`` against the best
        earlier call, and remember its full sequence and conversation (``messages`` + ``reply``) for later calls."""
        if call_index in self._encoded:
            raise PrefixDeltaError(f"call {call_index} was already encoded in this episode")
        prompt, completion = _tokens(prompt_ids), _tokens(completion_ids)
        base, prefix_length = self._best_base(prompt)
        count = 0
        if messages is not None and base is not None:
            count = common_message_prefix(self._conversations.get(base, ()), messages)
        if base is not None and prefix_length == len(self._sequences[base]):
            del self._sequences[base]  # the new call's sequence extends it: it can never be a better base
            self._conversations.pop(base, None)
        self._remember(call_index, np.concatenate([prompt, completion]))
        if messages is not None:
            self._conversations[call_index] = [*messages, *([reply] if reply is not None else [])]
        new_messages = None if messages is None else list(messages[count:])
        if base is None:
            return PromptDelta(None, 0, prompt, 0, new_messages)
        return PromptDelta(base, prefix_length, prompt[prefix_length:], count, new_messages)

    def _best_base(self, prompt: TokenArray) -> tuple[int | None, int]:
        best: tuple[int | None, int] = (None, 0)
        for index, sequence in reversed(self._sequences.items()):  # the most recent wins ties
            length = common_prefix_length(prompt, sequence)
            if length > best[1]:
                best = (index, length)
        return best

    def _remember(self, call_index: int, sequence: TokenArray) -> None:
        self._encoded.add(call_index)
        self._sequences[call_index] = sequence
        while len(self._sequences) > self._max_candidates:
            forgotten, _ = self._sequences.popitem(last=False)
            self._conversations.pop(forgotten, None)


class ReadCall(NamedTuple):
    """What ``PromptReconstructor.read_model_call`` read from one ModelCall record."""

    prompt: TokenArray  # the full prompt, read-only
    completion: TokenArray  # the completion's token ids, a read-only view of the record
    tool_calls: Any  # the response's tool calls, parsed from their JSON


class PromptReconstructor:
    """Consumer side, one per episode: rebuilds exact prompts from prefix deltas.

    With ``messages=False`` ``add_model_call`` checks the message deltas exactly as it otherwise would (the same
    errors for the same records) but keeps only each conversation's length, not its messages: for a consumer that
    needs the tokens only."""

    def __init__(self, *, messages: bool = True) -> None:
        """Start with no calls."""
        self.keeps_messages = messages
        self._prompts: dict[int, TokenArray] = {}
        self._sequences: dict[int, TokenArray] = {}
        self._messages: dict[int, list[Any]] = {}
        self._conversations: dict[int, list[Any]] = {}
        self._conversation_lengths: dict[int, int] = {}
        self._chains: dict[int, _Chain] = {}  # the buffer each call's sequence is a view of

    def add(
        self,
        call_index: int,
        base_call_index: int | None,
        prefix_length: int,
        new_token_ids: TokenInput,
        completion_ids: TokenInput,
    ) -> TokenArray:
        """Rebuild and remember the prompt of ``call_index``; return it (read-only)."""
        if call_index in self._sequences:
            raise PrefixDeltaError(f"call {call_index} was already added")
        prefix = self._prefix(call_index, base_call_index, prefix_length)
        new, completion = _tokens(new_token_ids), _tokens(completion_ids)
        chain = self._chains.get(base_call_index) if base_call_index is not None else None
        if chain is None or len(prefix) != chain.written:
            chain = _Chain(prefix)
        sequence = chain.extend(new, completion)
        self._chains[call_index] = chain
        self._sequences[call_index] = sequence
        self._prompts[call_index] = sequence[: len(prefix) + len(new)]
        return self._prompts[call_index]

    def add_model_call(self, record: Mapping[str, Any]) -> TokenArray:
        """``add`` from a decoded ModelCall record (packed token fields), rebuilding its messages too."""
        return self.read_model_call(record).prompt

    def read_model_call(self, record: Mapping[str, Any]) -> ReadCall:
        """``add_model_call``, also handing back the completion and tool calls it read on the way (a consumer that
        builds steps need not unpack and parse them a second time)."""
        call_index, base = record["call_index"], record["prompt_base_call_index"]
        count = record.get("request_messages_prefix_count", 0)
        if count and (base is None or base not in self._conversation_lengths):
            raise MissingBaseCallError(f"call {call_index}: {count} messages come from call {base}, which is unknown")
        available = min(count, self._conversation_lengths[base]) if count else 0
        if available != count:
            raise PrefixDeltaError(f"call {call_index}: base call {base} has only {available} messages, not {count}")
        completion = unpack_token_ids(record["completion_token_ids"])
        prompt = self.add(call_index, base, record["prompt_prefix_length"],
                          unpack_token_ids(record["prompt_token_ids"]), completion)  # fmt: skip
        new_messages = [*json.loads(record["request_messages_json"])]
        tool_calls = json.loads(record["response_tool_calls_json"])
        if self.keeps_messages:
            messages = [*(self._conversations[base][:count] if count else []), *new_messages]
            self._messages[call_index] = messages
            self._conversations[call_index] = [*messages, assistant_message(record["response_text"], tool_calls)]
        self._conversation_lengths[call_index] = count + len(new_messages) + 1
        return ReadCall(prompt, completion, tool_calls)

    def messages(self, call_index: int) -> list[Any]:
        """The full request messages of call ``call_index`` (added through ``add_model_call``)."""
        try:
            return self._messages[call_index]
        except KeyError:
            raise KeyError(f"call {call_index} has no messages (added without add_model_call?)") from None

    def prompt(self, call_index: int) -> TokenArray:
        """The full prompt of call ``call_index`` (read-only)."""
        try:
            return self._prompts[call_index]
        except KeyError:
            raise KeyError(f"call {call_index} has not been added") from None

    def sequence(self, call_index: int) -> TokenArray:
        """The full token sequence (prompt + completion) of call ``call_index`` (read-only)."""
        try:
            return self._sequences[call_index]
        except KeyError:
            raise KeyError(f"call {call_index} has not been added") from None

    def __contains__(self, call_index: object) -> bool:
        """Whether call ``call_index`` has been added."""
        return call_index in self._sequences

    def _prefix(self, call_index: int, base: int | None, prefix_length: int) -> TokenArray:
        if base is None:
            if prefix_length:
                raise PrefixDeltaError(f"call {call_index}: prefix_length {prefix_length} without a base call")
            return np.empty(0, dtype=np.int32)
        if base not in self._sequences:
            raise MissingBaseCallError(
                f"call {call_index} builds on call {base}, which has not been added (records out of order, or lost)"
            )
        base_sequence = self._sequences[base]
        if not 0 <= prefix_length <= len(base_sequence):
            raise PrefixDeltaError(
                f"call {call_index}: prefix_length {prefix_length} outside base call {base}'s "
                f"{len(base_sequence)} tokens"
            )
        return base_sequence[:prefix_length]


class _Chain:
    """A growing token buffer that the sequences of a linear conversation are read-only views of.

    Call ``k+1`` usually extends call ``k``'s whole sequence; copying that prefix for every call would make an
    episode's reconstruction quadratic in its length. A call whose prefix ends exactly where the buffer's written
    part ends appends after it instead (amortised doubling); the views handed out earlier end before what is
    appended, so they never change. Any other call starts a chain of its own with a copy of its prefix."""

    def __init__(self, prefix: TokenArray) -> None:
        self._buffer = np.empty(max(2 * len(prefix), 1024), dtype=np.int32)
        self._buffer[: len(prefix)] = prefix
        self._used = len(prefix)

    @property
    def written(self) -> int:
        """Tokens written so far. A prefix of a sequence of this chain that is this long is all of it, so what
        follows the prefix can be appended in place."""
        return self._used

    def extend(self, *parts: TokenArray) -> TokenArray:
        """Append ``parts``; the read-only view of everything written so far."""
        end = self._used + sum(len(part) for part in parts)
        if end > len(self._buffer):
            grown = np.empty(max(2 * len(self._buffer), end), dtype=np.int32)
            grown[: self._used] = self._buffer[: self._used]
            self._buffer = grown
        for part in parts:
            self._buffer[self._used : self._used + len(part)] = part
            self._used += len(part)
        view = self._buffer[:end]
        view.flags.writeable = False
        return view


def _tokens(ids: TokenInput) -> TokenArray:
    array = np.asarray(ids)
    if array.ndim != 1:
        raise PrefixDeltaError(f"token ids must be 1-D, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise PrefixDeltaError(f"token ids must be integers, got dtype {array.dtype}")
    return array.astype(np.int32, copy=False)
