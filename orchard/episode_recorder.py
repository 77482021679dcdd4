"""Publishes one episode's model calls (prefix delta encoded) and its outcome, keyed by episode id.

Keying every record of an episode by its id keeps them on one partition, in order, which is what the prefix
delta needs on the consumer side (a call's base is always an earlier call of the same episode).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from orchard.bus import Producer
from orchard.bus.base import DeliveryCallback
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.prefix_delta import PrefixDeltaEncoder, assistant_message
from orchard.topics import MODEL_CALLS, OUTCOMES

EpisodeStatus = Literal["SUCCEEDED", "FAILED", "TIMED_OUT", "CRASHED", "CANCELLED"]


class EpisodeRecorder:
    """One episode's publisher: ``record_call`` for each model call, then ``record_outcome`` once."""

    def __init__(
        self,
        producer: Producer,
        *,
        run_id: str,
        episode_id: str,
        task_id: str,
        harness: str,
        model: str,
        codec: Codec | None = None,
        model_calls_topic: str = MODEL_CALLS,
        outcomes_topic: str = OUTCOMES,
        on_call_delivery: DeliveryCallback | None = None,
    ) -> None:
        """``on_call_delivery`` is told of each ModelCall's acknowledgement (or failure) by the bus."""
        self.producer = producer
        self.codec = codec or Codec.default()
        self.identity = {"run_id": run_id, "episode_id": episode_id, "task_id": task_id}
        self.harness, self.model = harness, model
        self.topics = (model_calls_topic, outcomes_topic)
        self.calls = 0  # indices handed out (a failed publish uses one up)
        self.published_calls = 0
        self.bytes_published = 0
        self.started_at = now_ms()
        self._encoder = PrefixDeltaEncoder()
        self._key = episode_id.encode()
        self._on_call_delivery = on_call_delivery

    def record_call(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        prompt_ids: Sequence[int] | np.ndarray,
        completion_ids: Sequence[int] | np.ndarray,
        logprobs: Sequence[float] | np.ndarray,
        response_text: str,
        policy_version: int,
        tool_calls: Sequence[Any] = (),
        tools: Sequence[Any] = (),
        sampling: Mapping[str, Any] | None = None,
        finish_reason: str = "stop",
        latency_ms: float = 0.0,
        api_flavour: Literal["CHAT", "RESPONSES"] = "CHAT",
        harness_api: Literal["CHAT", "RESPONSES", "MESSAGES"] | None = None,
        conversation_id: int = 0,
        timestamp_ms: int | None = None,
        model: str | None = None,
        retokenized: bool = False,
        canonicalized_messages: Sequence[int] = (),
    ) -> int:
        """Publish one model call; return its call index.

        ``timestamp_ms``: when the request was received (default: now); ``model``: the model the request named
        (default: the episode's); ``retokenized``: the token ids come from tokenizing text afterwards (imported
        data), not from the engine's sampling, so ``logprobs`` is empty; ``canonicalized_messages``: indexes of the
        request's assistant turns the proxy put back as sampled (ModelCall v3). ``harness_api``: the API the harness
        spoke (default: ``api_flavour``, the form the messages are recorded in; MESSAGES is recorded in CHAT form).
        """
        index = self.calls
        delta = self._encoder.encode(
            index, prompt_ids, completion_ids, list(messages), assistant_message(response_text, tool_calls)
        )
        record = {
            **self.identity,
            "call_index": index,
            "conversation_id": conversation_id,
            "harness": self.harness,
            "api_flavour": api_flavour,
            "harness_api": harness_api or api_flavour,
            "model": self.model if model is None else model,
            "policy_version": policy_version,
            "request_messages_json": json.dumps(delta.new_messages),
            "request_messages_prefix_count": delta.messages_prefix_count,
            "request_tools_json": json.dumps(list(tools)),
            "sampling_params_json": json.dumps(dict(sampling or {})),
            "response_text": response_text,
            "response_tool_calls_json": json.dumps(list(tool_calls)),
            "finish_reason": finish_reason,
            "prompt_base_call_index": delta.base_call_index,
            "prompt_prefix_length": delta.prefix_length,
            "prompt_token_ids": delta.new_token_ids,
            "completion_token_ids": np.asarray(completion_ids, dtype=np.int32),
            "completion_logprobs": np.asarray(logprobs, dtype=np.float32),
            "retokenized": retokenized,
            "canonicalized_messages": [int(index) for index in canonicalized_messages],
            "latency_ms": latency_ms,
            "timestamp": now_ms() if timestamp_ms is None else timestamp_ms,
        }
        self.calls += 1  # the index is used up even if publishing fails, so indices never repeat
        try:
            self._publish(self.topics[0], self.codec.encode("ModelCall", record), self._on_call_delivery)
            self.published_calls += 1
        except Exception:
            # Later calls must not build on a call that never reached the bus: start the deltas afresh.
            self._encoder = PrefixDeltaEncoder()
            raise
        return index

    def record_outcome(
        self,
        *,
        status: EpisodeStatus,
        reward: float,
        group_id: str,
        signals: Mapping[str, float] | None = None,
        artifact_uris: Sequence[str] = (),
        policy_version: int | None = None,
        error: str | None = None,
    ) -> None:
        """Publish the episode's outcome (success is ``status == SUCCEEDED``)."""
        record = {
            **self.identity,
            "group_id": group_id,
            "status": status,
            "reward": reward,
            "success": status == "SUCCEEDED",
            "signals": dict(signals or {}),
            "num_model_calls": self.published_calls,
            "artifact_uris": list(artifact_uris),
            "policy_version": policy_version,
            "started_at": self.started_at,
            "ended_at": now_ms(),
            "error": error,
        }
        self._publish(self.topics[1], self.codec.encode("EpisodeOutcome", record))

    def _publish(self, topic: str, value: bytes, on_delivery: DeliveryCallback | None = None) -> None:
        self.producer.produce(topic, value, key=self._key, on_delivery=on_delivery)
        self.bytes_published += len(value)
