"""One episode, turn by turn, as the page shows it: each model call's request messages (tool calls and tool output
included), its reply, its completion tokens with their logprobs, the training samples' loss mask and advantages on
those tokens, the dense scores of the call, and the outcome.

The calls come from ``model-calls`` when the bus has them, else from the episode's ``Trajectory`` record; prompts
and messages are rebuilt from the prefix-delta encoding by ``orchard.trajectory``, as every consumer rebuilds them.
A sample is laid on a call when its token ids hold that call's prompt followed by its completion, which is where the
sample builder puts them (``consumers.sequences``); the mask and advantages shown are the sample's own values at
those positions, not recomputed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.codec import Codec
from orchard.serialization_errors import SerializationError
from orchard.tokens import unpack_logprobs, unpack_loss_mask, unpack_token_ids
from orchard.trajectory import Step, steps_from_model_calls
from orchard.trajectory_records import decode_calls, resolvable_calls
from orchard.viewer.index import EpisodeRecords
from orchard.viewer.tokens import TokenText
from orchard.viewer.values import finite, finite_list, ms


def episode_detail(entry: EpisodeRecords, summary: dict[str, Any], codec: Codec, tokens: TokenText) -> dict[str, Any]:
    """The page's view of one episode: ``summary`` (its list row), outcome, samples, and every call."""
    raw_calls, error = _decoded_calls(entry, codec)
    samples = _decoded(entry.samples.values(), codec)
    scores = [_score(record) for record in _decoded(entry.scores, codec)]
    try:
        steps = steps_from_model_calls(resolvable_calls(raw_calls))
    except (SerializationError, ValueError, KeyError) as exc:
        steps, error = (), f"cannot rebuild the calls' prompts: {exc}"
    by_index = {int(call["call_index"]): call for call in raw_calls}
    placed = {step.call_index for step in steps}
    return {
        **summary,
        "outcome": _outcome(entry.outcome),
        "token_mode": tokens.mode,
        "error": error,
        "samples": [_sample_header(sample) for sample in samples],
        "calls": [_call(step, by_index[step.call_index], samples, scores, tokens) for step in steps],
        "unplaced_scores": [s for s in scores if s["call_index"] not in placed],
    }


def _decoded_calls(entry: EpisodeRecords, codec: Codec) -> tuple[list[dict[str, Any]], str | None]:
    try:
        if entry.calls:
            return [codec.decode(entry.calls[i]).record for i in sorted(entry.calls)], None
        if entry.trajectory is not None:
            return decode_calls(codec.decode(entry.trajectory).record, codec), None
    except SerializationError as exc:
        return [], f"undecodable model call: {exc}"
    return [], None


def _decoded(values: Iterable[bytes], codec: Codec) -> list[dict[str, Any]]:
    """The decodable ones of ``values`` (the index already counted and logged the others)."""
    records = []
    for value in values:
        try:
            records.append(codec.decode(value).record)
        except SerializationError:
            continue
    return records


def _call(
    step: Step, record: dict[str, Any], samples: Sequence[dict[str, Any]], scores: list[dict[str, Any]],
    tokens: TokenText,
) -> dict[str, Any]:  # fmt: skip
    ids = step.completion_token_ids.tolist()
    return {
        "call_index": step.call_index,
        "conversation_id": step.conversation_id,
        "policy_version": step.policy_version,
        "model": record.get("model"),
        "harness": record.get("harness"),
        "finish_reason": step.finish_reason,
        "latency_ms": finite(record.get("latency_ms")),
        "timestamp_ms": ms(record.get("timestamp")),
        "retokenized": step.retokenized,
        "prompt_tokens": len(step.prompt_token_ids),
        "request_messages": step.request_messages,
        "request_tools": _json(record.get("request_tools_json"), []),
        "sampling_params": _json(record.get("sampling_params_json"), {}),
        "response_text": step.response_text,
        "response_tool_calls": step.response_tool_calls,
        "token_ids": ids,
        "token_text": tokens.texts(ids),
        "logprobs": finite_list(step.completion_logprobs.tolist()) if len(step.completion_logprobs) else None,
        "sample_spans": _sample_spans(step, samples),
        "scores": [score for score in scores if score["call_index"] == step.call_index],
    }


def _sample_spans(step: Step, samples: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per sample holding this call's prompt and completion: its loss mask and advantages on the completion."""
    prompt, completion = step.prompt_token_ids, step.completion_token_ids
    start, end = len(prompt), len(prompt) + len(completion)
    spans: dict[str, dict[str, Any]] = {}
    for sample in samples:
        ids = unpack_token_ids(sample["token_ids"])
        if len(ids) < end or not _same(ids[:start], prompt) or not _same(ids[start:end], completion):
            continue
        mask = unpack_loss_mask(sample["loss_mask"])[start:end]
        advantages = unpack_logprobs(sample["advantages"])[start:end]
        spans[str(sample["sample_id"])] = {
            "start": start,
            "loss_mask": mask.tolist(),
            "advantages": finite_list(advantages.tolist()),
        }
    return spans


def _same(a: npt.NDArray[np.int32], b: npt.NDArray[np.int32]) -> bool:
    return len(a) == len(b) and bool(np.array_equal(a, b))


def _sample_header(sample: dict[str, Any]) -> dict[str, Any]:
    return {
        "sample_id": sample["sample_id"],
        "kind": sample["kind"],
        "policy_version": sample["policy_version"],
        "reward": finite(sample["reward"]),
        "tokens": len(unpack_token_ids(sample["token_ids"])),
        "trained_tokens": int(unpack_loss_mask(sample["loss_mask"]).sum()),
        "created_ms": ms(sample.get("created_at")),
    }


def _score(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "call_index": int(record["call_index"]),
        "scorer": record["scorer"],
        "policy_version": record["policy_version"],
        "token_start": record.get("token_start"),
        "token_end": record.get("token_end"),
        "score": finite(record["score"]),
        "details": _json(record.get("details_json"), {}),
        "timestamp_ms": ms(record.get("timestamp")),
    }


def _outcome(outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {
        "status": outcome["status"],
        "reward": finite(outcome["reward"]),
        "success": bool(outcome["success"]),
        "signals": {name: finite(value) for name, value in (outcome.get("signals") or {}).items()},
        "num_model_calls": outcome.get("num_model_calls"),
        "artifact_uris": list(outcome.get("artifact_uris") or []),
        "error": outcome.get("error"),
        "group_id": outcome.get("group_id"),
        "started_ms": ms(outcome.get("started_at")),
        "ended_ms": ms(outcome.get("ended_at")),
    }


def _json(text: Any, default: Any) -> Any:
    if not isinstance(text, str):
        return default
    try:
        return json.loads(text)
    except ValueError:
        return text
