"""Prefix-delta encoding of multi-turn prompts: exact reconstruction and linear growth."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from orchard.codec import Codec
from orchard.prefix_delta import PrefixDeltaEncoder, PromptReconstructor, common_prefix_length
from orchard.serialization_errors import MissingBaseCallError, PrefixDeltaError
from orchard.tokens import pack_logprobs, pack_token_ids

RNG_SEED = 1234


def _tokens(rng: np.random.Generator, n: int, low: int = 10) -> np.ndarray:
    return rng.integers(low, 150_000, n).astype(np.int32)


def _growing_episode(calls: int, new_per_call: int = 100, completion: int = 50) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each prompt = previous prompt + previous completion + ``new_per_call`` new tokens."""
    rng = np.random.default_rng(RNG_SEED)
    episode = []
    prompt = _tokens(rng, 300)
    for _ in range(calls):
        comp = _tokens(rng, completion)
        episode.append((prompt, comp))
        prompt = np.concatenate([prompt, comp, _tokens(rng, new_per_call)])
    return episode


def _model_call(index: int, delta: Any, completion: np.ndarray) -> dict[str, Any]:
    return {
        "run_id": "run-7",
        "episode_id": "ep-42",
        "task_id": "django__django-11099",
        "call_index": index,
        "harness": "mini-swe-agent",
        "api_flavour": "CHAT",
        "model": "orchard-swe-3b",
        "policy_version": 3,
        "request_messages_json": "[]",
        "response_text": "",
        "finish_reason": "stop",
        "prompt_base_call_index": delta.base_call_index,
        "prompt_prefix_length": delta.prefix_length,
        "prompt_token_ids": pack_token_ids(delta.new_token_ids),
        "completion_token_ids": pack_token_ids(completion),
        "completion_logprobs": pack_logprobs(np.full(len(completion), -0.25)),
        "latency_ms": 812.0,
        "timestamp": datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    }


def _encoded_episode_bytes(calls: int) -> list[int]:
    codec, encoder = Codec.default(), PrefixDeltaEncoder()
    sizes = []
    for index, (prompt, completion) in enumerate(_growing_episode(calls)):
        delta = encoder.encode(index, prompt, completion)
        sizes.append(len(codec.encode("ModelCall", _model_call(index, delta, completion))))
    return sizes


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [([], [], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2], [1, 2, 3], 2), ([1, 2, 3], [1, 9, 3], 1), ([5], [6], 0)],
)
def test_common_prefix_length(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix_length(np.array(a, dtype=np.int32), np.array(b, dtype=np.int32)) == expected


def test_each_call_of_a_growing_conversation_stores_only_its_new_tokens() -> None:
    episode = _growing_episode(30)
    encoder = PrefixDeltaEncoder()
    deltas = [encoder.encode(i, prompt, completion) for i, (prompt, completion) in enumerate(episode)]
    assert [(d.base_call_index, d.prefix_length, len(d.new_token_ids)) for d in deltas] == [(None, 0, 300)] + [
        (i - 1, 300 + (i - 1) * 150 + 50, 100) for i in range(1, 30)
    ]


def test_episode_bytes_grow_linearly_not_quadratically() -> None:
    sizes_30, sizes_60 = _encoded_episode_bytes(30), _encoded_episode_bytes(60)
    # every call after the first costs the same: 100 new + 50 completion tokens, 4 + 4 + 4 bytes each
    assert max(sizes_60[1:]) - min(sizes_60[1:]) <= 4
    assert max(sizes_60[1:]) < 100 * 4 + 50 * 12 + 300
    assert sum(sizes_60) / sum(sizes_30) < 2.1
    naive_30 = sum(len(p) for p, _ in _growing_episode(30)) * 4
    naive_60 = sum(len(p) for p, _ in _growing_episode(60)) * 4
    assert naive_60 / naive_30 > 3.5  # what storing whole prompts would cost


def test_reconstruction_from_decoded_records_is_exact() -> None:
    codec, encoder, reconstructor = Codec.default(), PrefixDeltaEncoder(), PromptReconstructor()
    episode = _growing_episode(30)
    for index, (prompt, completion) in enumerate(episode):
        data = codec.encode("ModelCall", _model_call(index, encoder.encode(index, prompt, completion), completion))
        reconstructor.add_model_call(codec.decode(data).record)
    for index, (prompt, completion) in enumerate(episode):
        np.testing.assert_array_equal(reconstructor.prompt(index), prompt)
        np.testing.assert_array_equal(reconstructor.sequence(index), np.concatenate([prompt, completion]))


def _round_trip(calls: list[tuple[int, np.ndarray, np.ndarray]], **encoder_args: int) -> list[Any]:
    """Encode then reconstruct ``(call_index, prompt, completion)`` in order; return the deltas."""
    encoder, reconstructor = PrefixDeltaEncoder(**encoder_args), PromptReconstructor()
    deltas = []
    for index, prompt, completion in calls:
        delta = encoder.encode(index, prompt, completion)
        deltas.append(delta)
        rebuilt = reconstructor.add(index, delta.base_call_index, delta.prefix_length, delta.new_token_ids, completion)
        np.testing.assert_array_equal(rebuilt, prompt)
    for index, prompt, _ in calls:
        np.testing.assert_array_equal(reconstructor.prompt(index), prompt)
    return deltas


def test_a_prompt_diverging_from_every_earlier_call_is_stored_whole() -> None:
    rng = np.random.default_rng(RNG_SEED)
    first, comp = _tokens(rng, 200), _tokens(rng, 20)
    other = np.concatenate([[1], _tokens(rng, 150)]).astype(np.int32)  # token 1 starts no earlier sequence
    deltas = _round_trip([(0, first, comp), (1, np.concatenate([first, comp, [7, 8]]), comp), (2, other, comp)])
    assert (deltas[2].base_call_index, deltas[2].prefix_length) == (None, 0)
    np.testing.assert_array_equal(deltas[2].new_token_ids, other)


def test_the_base_is_the_call_sharing_the_longest_prefix() -> None:
    rng = np.random.default_rng(RNG_SEED)
    system, main_turn, sub_task = _tokens(rng, 100), _tokens(rng, 400), _tokens(rng, 80)
    comp = _tokens(rng, 30)
    main_0 = np.concatenate([system, main_turn])
    sub_1 = np.concatenate([system, sub_task])  # a sub-agent sharing only the system prompt
    main_2 = np.concatenate([main_0, comp, _tokens(rng, 10)])  # the main agent continues
    deltas = _round_trip([(0, main_0, comp), (1, sub_1, comp), (2, main_2, comp)])
    assert [(d.base_call_index, d.prefix_length, len(d.new_token_ids)) for d in deltas] == [
        (None, 0, 500),
        (0, 100, 80),
        (0, 530, 10),
    ]


def test_a_retried_call_refers_to_the_earlier_prompt_with_no_new_tokens() -> None:
    rng = np.random.default_rng(RNG_SEED)
    prompt = _tokens(rng, 64)
    deltas = _round_trip([(0, prompt, _tokens(rng, 8)), (1, prompt, _tokens(rng, 9))])
    assert [(d.base_call_index, d.prefix_length, len(d.new_token_ids)) for d in deltas[1:]] == [(0, 64, 0)]


def test_calls_may_arrive_with_call_indices_out_of_order() -> None:
    rng = np.random.default_rng(RNG_SEED)
    base, comp = _tokens(rng, 50), _tokens(rng, 5)
    calls = [(0, base, comp), (6, np.concatenate([base, comp, [3]]), comp), (5, np.concatenate([base, [4]]), comp)]
    deltas = _round_trip(calls)
    assert [d.base_call_index for d in deltas] == [None, 0, 6]


def test_a_bounded_encoder_still_reconstructs_exactly() -> None:
    rng = np.random.default_rng(RNG_SEED)
    a, b, comp = _tokens(rng, 300), _tokens(rng, 300), _tokens(rng, 10)
    calls = [(0, a, comp), (1, b, comp), (2, np.concatenate([b, comp]), comp), (3, np.concatenate([a, [5]]), comp)]
    deltas = _round_trip(calls, max_candidates=1)
    assert [d.base_call_index for d in deltas] == [None, None, 1, None]  # call 0 was forgotten


def test_a_missing_base_call_is_a_clear_error() -> None:
    reconstructor = PromptReconstructor()
    with pytest.raises(MissingBaseCallError, match="call 4 builds on call 3, which has not been added"):
        reconstructor.add(4, 3, 10, [1, 2], [3])


def test_inconsistent_deltas_are_rejected() -> None:
    reconstructor = PromptReconstructor()
    reconstructor.add(0, None, 0, [1, 2, 3], [4])
    with pytest.raises(PrefixDeltaError, match="prefix_length 9 outside base call 0's 4 tokens"):
        reconstructor.add(1, 0, 9, [5], [6])
    with pytest.raises(PrefixDeltaError, match="prefix_length 2 without a base call"):
        reconstructor.add(2, None, 2, [5], [6])
    with pytest.raises(PrefixDeltaError, match="call 0 was already added"):
        reconstructor.add(0, None, 0, [1], [2])
    with pytest.raises(KeyError, match="call 9 has not been added"):
        reconstructor.prompt(9)


def test_the_encoder_rejects_a_call_index_twice() -> None:
    encoder = PrefixDeltaEncoder()
    encoder.encode(0, [1, 2], [3])
    with pytest.raises(PrefixDeltaError, match="call 0 was already encoded"):
        encoder.encode(0, [1, 2], [3])


def test_reconstructed_arrays_are_read_only() -> None:
    reconstructor = PromptReconstructor()
    prompt = reconstructor.add(0, None, 0, np.array([1, 2], dtype=np.int32), [3])
    assert (prompt.flags.writeable, reconstructor.sequence(0).flags.writeable) == (False, False)


def test_views_handed_out_never_change_as_conversations_grow_and_branch() -> None:
    # A long conversation (its buffer grows several times), a retry of call 3 and a branch from the middle of call
    # 5's sequence: every prompt and sequence returned stays what plain concatenation gives, to the end.
    rng = np.random.default_rng(RNG_SEED)
    reconstructor, expected, returned = PromptReconstructor(), {}, {}
    adds = [(0, None, 0)] + [(i, i - 1, None) for i in range(1, 40)] + [(40, 3, None), (41, 5, 700), (42, 41, None)]
    for index, base, prefix_length in adds:
        new, completion = _tokens(rng, int(rng.integers(0, 400))), _tokens(rng, int(rng.integers(0, 60)))
        if prefix_length is None and base is not None:
            prefix_length = len(expected[base][1])  # the whole base sequence
        prefix = expected[base][1][:prefix_length] if base is not None else np.empty(0, np.int32)
        prompt = np.concatenate([prefix, new])
        expected[index] = (prompt, np.concatenate([prompt, completion]))
        returned[index] = (reconstructor.add(index, base, prefix_length or 0, new, completion),
                           reconstructor.sequence(index))  # fmt: skip
    for index, (prompt, sequence) in expected.items():
        np.testing.assert_array_equal(returned[index][0], prompt)
        np.testing.assert_array_equal(returned[index][1], sequence)
        np.testing.assert_array_equal(reconstructor.prompt(index), prompt)


def _episode_records(calls: int) -> tuple[list[bytes], list[list[dict[str, str]]], list[np.ndarray]]:
    """Encode a chat episode whose conversation grows by the reply and a tool result each call."""

    from orchard.prefix_delta import assistant_message

    codec = Codec.default()
    rng = np.random.default_rng(3)
    encoder = PrefixDeltaEncoder()
    messages: list[dict[str, str]] = [{"role": "user", "content": "fix the bug " * 50}]
    prompt = rng.integers(0, 50_000, 400)
    encoded, conversations, prompts = [], [], []
    for k in range(calls):
        completion = rng.integers(0, 50_000, 60)
        reply_text = f"step {k}: run the tests"
        delta = encoder.encode(k, prompt, completion, messages, assistant_message(reply_text))
        record = {
            "run_id": "r", "episode_id": "e", "task_id": "t", "call_index": k, "harness": "builtin",
            "api_flavour": "CHAT", "model": "tiny", "policy_version": 0,
            "request_messages_json": json.dumps(delta.new_messages),
            "request_messages_prefix_count": delta.messages_prefix_count,
            "response_text": reply_text, "finish_reason": "stop",
            "prompt_base_call_index": delta.base_call_index, "prompt_prefix_length": delta.prefix_length,
            "prompt_token_ids": delta.new_token_ids, "completion_token_ids": completion,
            "completion_logprobs": np.zeros(60, dtype=np.float32), "latency_ms": 1.0, "timestamp": 0,
        }  # fmt: skip
        encoded.append(codec.encode("ModelCall", record))
        conversations.append(list(messages))
        prompts.append(prompt)
        messages = [*messages, assistant_message(reply_text), {"role": "tool", "content": f"output {k} " * 40}]
        prompt = np.concatenate([prompt, completion, rng.integers(0, 50_000, 80)])
    return encoded, conversations, prompts


def test_messages_and_prompts_are_rebuilt_exactly_from_the_deltas() -> None:

    encoded, conversations, prompts = _episode_records(12)
    codec = Codec.default()
    rebuilt = PromptReconstructor()
    for k, data in enumerate(encoded):
        record = codec.decode(data).record
        assert np.array_equal(rebuilt.add_model_call(record), prompts[k])
        assert rebuilt.messages(k) == conversations[k]
        if k:
            assert record["request_messages_prefix_count"] == len(conversations[k]) - 1
            assert len(json.loads(record["request_messages_json"])) == 1


def test_episode_bytes_with_messages_grow_linearly() -> None:
    thirty = sum(len(b) for b in _episode_records(30)[0])
    sixty = sum(len(b) for b in _episode_records(60)[0])
    assert sixty < 2.2 * thirty
