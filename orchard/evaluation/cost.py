"""What an evaluation cost: model calls, prompt and completion tokens, wall time and episode time.

Model calls and episode times come from the outcomes (``num_model_calls``, ``started_at``/``ended_at``). Tokens
come from the evaluation episodes' ``ModelCall`` records on the ``model-calls`` topic, read once the outcomes are
in. By then the calls are already on the bus: Env closes the proxy episode before it publishes the outcome, and the
proxy answers that close only once every recorded call is acknowledged by the bus (``producers/proxy/episodes.py``,
``orchard/env/episode_runner.py``). So the reader takes the topic's end offsets as they are now and reads up to
them, starting a little before the earliest episode start (a seek by record time), and decodes only the records
keyed by a wanted episode id (the proxy keys every call by its episode id). It stops at those end offsets, once
every expected call (the outcome's ``num_model_calls``) is counted, or at its deadline, whichever comes first; the
counts are then partial and ``calls_read < model_calls`` says so. Reading never fails the evaluation: a bus error
leaves the token counts unknown (None).

Prompt tokens count each call's whole prompt (the prefix a prefix-delta record shares with an earlier call
included), as an API bills it; completion tokens count the sampled tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchard.bus import Bus, Consumer, Record, TopicPartition
from orchard.bus.exceptions import BusError, TopicNotFoundError
from orchard.codec import Codec
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.tokens import PACKED_DTYPES
from orchard.topics import MODEL_CALLS

log = get_logger("orchard.evaluation.cost")

CLOCK_MARGIN_MS = 120_000
"""How far before the earliest episode start the reader begins: the outcome's start time is Env's clock, a record's
time the proxy's (or the broker's); two minutes absorbs any sane skew between them."""
_TOKEN_BYTES = PACKED_DTYPES["int32"].itemsize


@dataclass(frozen=True, slots=True)
class TokenCount:
    """Tokens of the model calls read: ``calls`` records, their prompt and completion tokens."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EvalCost:
    """The cost of one stage's evaluation.

    ``calls_read``, ``prompt_tokens`` and ``completion_tokens`` are None when the calls were not read; the token
    counts are partial when ``calls_read < model_calls``.
    """

    model_calls: int
    calls_read: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    wall_time_s: float
    episode_time_s: float
    timed_episodes: int

    @property
    def total_tokens(self) -> int | None:
        """Prompt plus completion tokens (None when unknown)."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    @property
    def mean_episode_time_s(self) -> float | None:
        """Mean duration of the episodes with an outcome (None when there is none)."""
        return self.episode_time_s / self.timed_episodes if self.timed_episodes else None

    @property
    def tokens_complete(self) -> bool:
        """Whether a token count was read for every model call."""
        return self.calls_read is not None and self.calls_read >= self.model_calls

    def to_json(self) -> dict[str, Any]:
        """The cost as JSON-ready data, with the derived totals."""
        return asdict(self) | {
            "total_tokens": self.total_tokens,
            "mean_episode_time_s": self.mean_episode_time_s,
            "tokens_complete": self.tokens_complete,
        }


def cost_of(
    model_calls: Sequence[int], durations_s: Sequence[float], wall_time_s: float, tokens: TokenCount | None
) -> EvalCost:
    """The cost of episodes with these call counts and durations (finished episodes only), the evaluation's wall
    time and the tokens read (None: not read).

    >>> cost = cost_of([3, 2], [4.0, 2.0], 10.0, TokenCount(calls=5, prompt_tokens=100, completion_tokens=20))
    >>> cost.model_calls, cost.total_tokens, cost.mean_episode_time_s, cost.tokens_complete
    (5, 120, 3.0, True)
    """
    return EvalCost(
        model_calls=sum(model_calls),
        calls_read=None if tokens is None else tokens.calls,
        prompt_tokens=None if tokens is None else tokens.prompt_tokens,
        completion_tokens=None if tokens is None else tokens.completion_tokens,
        wall_time_s=wall_time_s,
        episode_time_s=sum(durations_s),
        timed_episodes=len(durations_s),
    )


def call_tokens(call: Mapping[str, Any]) -> tuple[int, int]:
    """Prompt and completion tokens of one decoded ``ModelCall`` (packed int32 arrays, prefix-delta prompt).

    >>> call_tokens({"prompt_prefix_length": 10, "prompt_token_ids": bytes(12), "completion_token_ids": bytes(8)})
    (13, 2)
    """
    prompt = int(call["prompt_prefix_length"]) + len(call["prompt_token_ids"]) // _TOKEN_BYTES
    return prompt, len(call["completion_token_ids"]) // _TOKEN_BYTES


def read_token_counts(
    bus: Bus,
    expected_calls: Mapping[str, int],
    *,
    deadline: float,
    since_ms: int | None = None,
    topic: str = MODEL_CALLS,
    codec: Codec | None = None,
    poll_s: float = 1.0,
) -> TokenCount | None:
    """The tokens of the model calls of the episodes in ``expected_calls`` (episode id -> calls expected), read
    until the topic's current end, until every expected call is counted, or until ``deadline`` (a monotonic time).
    ``since_ms``: start at the first record at or after this time less ``CLOCK_MARGIN_MS`` (default: the start of
    the topic). None when the bus could not be read."""
    if not expected_calls:
        return TokenCount()
    try:
        return _read(bus, expected_calls, deadline, since_ms, topic, codec or Codec.default(), poll_s)
    except TopicNotFoundError:
        return TokenCount()
    except BusError as exc:
        log.warning("model calls not read; token counts unknown", topic=topic, error=str(exc))
        return None


def _read(
    bus: Bus,
    expected: Mapping[str, int],
    deadline: float,
    since_ms: int | None,
    topic: str,
    codec: Codec,
    poll_s: float,
) -> TokenCount:
    info = bus.describe_topic(topic)
    ends = {TopicPartition(topic, p): end for p, end in info.end_offsets.items()}
    seen: set[tuple[str, int]] = set()  # (episode, call index): a call delivered twice counts once
    prompt = completion = 0
    with bus.consumer([topic], group=None, start="earliest") as consumer:
        reached = _start(consumer, info.start_offsets, topic, since_ms)
        wanted_calls = sum(expected.values())
        while len(seen) < wanted_calls and not _at_end(reached, ends) and time.monotonic() < deadline:
            records = consumer.poll(timeout_s=min(poll_s, max(0.0, deadline - time.monotonic())))
            for record in records:
                reached[record.topic_partition] = max(reached.get(record.topic_partition, 0), record.offset + 1)
            for call in _calls(records, expected, codec):
                key = (str(call["episode_id"]), int(call["call_index"]))
                if key not in seen:
                    seen.add(key)
                    tokens = call_tokens(call)
                    prompt, completion = prompt + tokens[0], completion + tokens[1]
            for tp, offset in consumer.position().items():  # also past records never returned (markers)
                reached[tp] = max(reached.get(tp, 0), offset)
    if len(seen) < wanted_calls:
        log.warning("token counts are partial", topic=topic, calls_read=len(seen), calls_expected=wanted_calls)
    return TokenCount(calls=len(seen), prompt_tokens=prompt, completion_tokens=completion)


def _start(
    consumer: Consumer, start_offsets: Mapping[int, int], topic: str, since_ms: int | None
) -> dict[TopicPartition, int]:
    """Seek to ``since_ms`` (less the clock margin) when given; the first offset of each partition to read."""
    consumer.assignment()  # the Kafka backend assigns partitions on first use; a seek needs them assigned
    starts = {TopicPartition(topic, p): offset for p, offset in start_offsets.items()}
    if since_ms is not None:
        starts.update(consumer.seek_to_timestamp(max(0, since_ms - CLOCK_MARGIN_MS)))
    return starts


def _at_end(reached: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]) -> bool:
    return all(reached.get(tp, 0) >= end for tp, end in ends.items())


def _calls(records: Iterable[Record], expected: Mapping[str, int], codec: Codec) -> Iterable[Mapping[str, Any]]:
    for record in records:
        # calls are keyed by episode id: skip other episodes without decoding them
        if record.key is None or record.key.decode("utf-8", "replace") not in expected:
            continue
        try:
            decoded = codec.decode(record.value)
        except SerializationError as exc:
            log.warning("undecodable model call skipped", partition=record.partition, offset=record.offset,
                        error=str(exc))  # fmt: skip
            continue
        if decoded.name == "ModelCall" and decoded.record["episode_id"] in expected:
            yield decoded.record
