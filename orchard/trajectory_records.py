"""The wire form of an assembled trajectory (``Trajectory`` records on the ``trajectories`` topic) and back.

A ``Trajectory`` record nests the episode's original encoded ``ModelCall`` and ``EpisodeOutcome`` records
(see ``schemas/README.md``); ``trajectory_from_record`` decodes them and resolves prefix deltas into the
in-memory ``orchard.trajectory.Trajectory`` every downstream consumer works with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from orchard.codec import Codec
from orchard.prefix_delta import PromptReconstructor
from orchard.tokens import unpack_logprobs
from orchard.trajectory import Step, Trajectory, trajectory_from_records


def trajectory_record(
    *,
    run_id: str,
    episode_id: str,
    task_id: str,
    calls: Sequence[bytes],
    outcome: bytes | None,
    outcome_fields: Mapping[str, Any] | None,
    policy_version: int | None,
    timestamp_ms: int,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The ``Trajectory`` record of one episode: ``calls`` are encoded ModelCalls in call order, ``outcome`` the
    encoded EpisodeOutcome (``outcome_fields`` its decoded fields), or None when it never arrived."""
    return {
        "run_id": run_id,
        "episode_id": episode_id,
        "task_id": task_id,
        "group_id": outcome_fields["group_id"] if outcome_fields is not None else "",
        "policy_version": policy_version,
        "complete": incomplete_reason is None and outcome is not None,
        "incomplete_reason": incomplete_reason,
        "num_model_calls": outcome_fields["num_model_calls"] if outcome_fields is not None else None,
        "outcome": outcome,
        "calls": list(calls),
        "timestamp": timestamp_ms,
    }


def decode_calls(record: Mapping[str, Any], codec: Codec | None = None) -> list[dict[str, Any]]:
    """The decoded ModelCall records of a decoded Trajectory record, in call order."""
    codec = codec or Codec.default()
    return [codec.decode(call).record for call in record["calls"]]


def decode_outcome(record: Mapping[str, Any], codec: Codec | None = None) -> dict[str, Any] | None:
    """The decoded EpisodeOutcome of a decoded Trajectory record, or None."""
    outcome = record.get("outcome")
    return None if outcome is None else (codec or Codec.default()).decode(outcome).record


def resolvable_calls(calls: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The calls whose prefix-delta base chain is all present (an incomplete episode may miss a base call)."""
    kept: list[Mapping[str, Any]] = []
    present: set[int] = set()
    for call in sorted(calls, key=lambda c: c["call_index"]):
        base = call.get("prompt_base_call_index")
        if base is None or base in present:
            kept.append(call)
            present.add(call["call_index"])
    return kept


def trajectory_from_record(
    record: Mapping[str, Any], codec: Codec | None = None, *, messages: bool = True
) -> Trajectory:
    """The in-memory ``Trajectory`` of a decoded ``Trajectory`` record (prompts resolved, incomplete kept so).

    ``messages=False``: the steps' ``request_messages`` are left empty (the record is checked all the same, and
    refused for the same reasons) and their token arrays are read-only views of the record: for a consumer that
    needs only the tokens, at a fraction of the cost."""
    codec = codec or Codec.default()
    calls = decode_calls(record, codec)
    outcome = decode_outcome(record, codec)
    if not calls and outcome is None:
        return Trajectory(
            run_id=record["run_id"],
            episode_id=record["episode_id"],
            task_id=record["task_id"],
            group_id=record["group_id"],
            steps=(),
            complete=False,
            incomplete_reason=record.get("incomplete_reason") or "no outcome and no calls",
        )
    if not record["complete"]:
        calls = list(resolvable_calls(calls))  # type: ignore[arg-type]
    reason = None if record["complete"] else record.get("incomplete_reason")
    if messages:
        return trajectory_from_records(calls, outcome, incomplete_reason=reason)
    outline = trajectory_from_records(calls[:1] if outcome is None else [], outcome, incomplete_reason=reason)
    return replace(outline, steps=token_steps(calls))


def token_steps(records: Iterable[Mapping[str, Any]]) -> tuple[Step, ...]:
    """``orchard.trajectory.steps_from_model_calls`` without the request messages (see ``trajectory_from_record``)."""
    reconstructor = PromptReconstructor(messages=False)
    steps = []
    for record in sorted(records, key=lambda r: r["call_index"]):
        prompt, completion, tool_calls = reconstructor.read_model_call(record)
        steps.append(
            Step(
                call_index=record["call_index"],
                conversation_id=record.get("conversation_id", 0),
                policy_version=record["policy_version"],
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                completion_logprobs=unpack_logprobs(record["completion_logprobs"]),
                request_messages=[],
                response_text=record["response_text"],
                response_tool_calls=tool_calls,
                finish_reason=record["finish_reason"],
                retokenized=record.get("retokenized", False),
            )
        )
    return tuple(steps)


def record_timestamp_ms(record: Mapping[str, Any]) -> int:
    """The record's ``timestamp`` field in milliseconds (the codec decodes it to a datetime)."""
    value = record["timestamp"]
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
