"""Conversation lineage: which conversation of its episode each model call belongs to.

One episode may hold several conversations (a harness that starts subagents, one that compacts its context, a chat
template that drops earlier reasoning). A call *continues* a conversation when its prompt token ids begin with the
full sequence (prompt + completion) of that conversation's latest call, so every conversation is one token-exact
sequence; when several qualify, the one with the longest latest sequence wins. A prompt that continues none (a
subagent's fresh context, a compacted context, a retry of an earlier prompt, a re-templated history) starts a new
conversation instead of corrupting one. Ids are 0, 1, 2, ... in order of first appearance.

Departure: only the ``max_conversations`` most recently continued conversations are remembered, which bounds memory
and per-call cost; a call continuing a forgotten one starts a new conversation (never a wrong sequence).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

TokenIds = Sequence[int] | npt.NDArray[np.integer]


class ConversationTracker:
    """One episode's conversations, each remembered by the full token sequence of its latest call."""

    def __init__(self, max_conversations: int = 64) -> None:
        """Remember at most ``max_conversations`` conversations (the most recently continued)."""
        if max_conversations < 1:
            raise ValueError("max_conversations must be at least 1")
        self._max = max_conversations
        self._tips: OrderedDict[int, npt.NDArray[np.int32]] = OrderedDict()
        self._next_id = 0

    @property
    def count(self) -> int:
        """Conversations started so far."""
        return self._next_id

    def classify(self, prompt_ids: TokenIds) -> int:
        """The conversation a call with this prompt continues, or the id the next new conversation will get."""
        prompt = np.asarray(prompt_ids, dtype=np.int32)
        best, best_length = self._next_id, 0
        for conversation, tip in self._tips.items():
            length = len(tip)
            if best_length < length <= len(prompt) and np.array_equal(prompt[:length], tip):
                best, best_length = conversation, length
        return best

    def advance(self, conversation: int, prompt_ids: TokenIds, completion_ids: TokenIds) -> None:
        """Record that a call of ``conversation`` (from ``classify``) was made: its sequence is the new tip."""
        if conversation == self._next_id:
            self._next_id += 1
        elif conversation not in self._tips:
            raise ValueError(f"conversation {conversation} is not known")
        tip = np.concatenate([np.asarray(prompt_ids, dtype=np.int32), np.asarray(completion_ids, dtype=np.int32)])
        self._tips[conversation] = tip
        self._tips.move_to_end(conversation)
        while len(self._tips) > self._max:
            self._tips.popitem(last=False)

    def assign(self, prompt_ids: TokenIds, completion_ids: TokenIds) -> int:
        """``classify`` then ``advance``: the conversation of a call that was made."""
        conversation = self.classify(prompt_ids)
        self.advance(conversation, prompt_ids, completion_ids)
        return conversation
