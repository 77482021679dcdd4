"""``orchard import``: trajectory datasets become the same ModelCall / EpisodeOutcome records live episodes produce.

Each row is one episode, published through ``EpisodeRecorder`` (prefix-delta encoded, keyed by episode id), so
the trajectory assembler, credit assignment and the sample builder treat it like any recorded episode. Chat rows
are split into calls and tokenized with the policy's chat template (``conversation.ChatTokenizer``) and marked
``retokenized`` with no logprobs, so nothing mistakes them for on-policy samples; ``orchard``-layout rows (what
``orchard export`` writes) carry their token ids and are published as recorded.

A malformed row is dead-lettered (``DeadLetter`` with ``source_topic = file:<path>``, ``source_offset`` = its
0-based row number, and the reason) and the import carries on. Everything a row needs is checked before its first
record is published; should the bus still refuse one of its records (too large), the episode is closed with a
``CANCELLED`` outcome naming the error, so no consumer waits for it, and the row is dead-lettered too.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from orchard.bus import Producer, Record
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.bus.exceptions import RecordTooLargeError
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.datasets.conversation import ChatTokenizer
from orchard.datasets.exceptions import DatasetError, RowError
from orchard.datasets.layouts import Layout, extract
from orchard.datasets.orchard_format import calls_from_row
from orchard.datasets.sources import SourceRow, iter_rows
from orchard.episode_recorder import EpisodeRecorder, EpisodeStatus
from orchard.logging import get_logger
from orchard.serialization_errors import PrefixDeltaError, SchemaValidationError
from orchard.topics import DEAD_LETTERS, MODEL_CALLS, OUTCOMES

log = get_logger("datasets.importer")
FLUSH_EVERY_ROWS = 256  # bounds what the producer holds unacknowledged


@dataclass
class ImportStats:
    """What an import did."""

    rows: int = 0
    episodes: int = 0
    calls: int = 0
    tokens: int = 0
    dead_lettered: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        """Rows read per second."""
        return self.rows / self.seconds if self.seconds else 0.0


class DatasetImporter:
    """Publishes dataset rows as episodes of run ``run_id`` (``orchard`` rows keep their run unless one is given)."""

    def __init__(
        self,
        producer: Producer,
        layout: Layout,
        *,
        run_id: str | None,
        tokenizer: ChatTokenizer | None = None,
        policy_version: int = 0,
        codec: Codec | None = None,
        model_calls_topic: str = MODEL_CALLS,
        outcomes_topic: str = OUTCOMES,
        dead_letter_topic: str = DEAD_LETTERS,
    ) -> None:
        """A chat or gui ``layout`` needs ``tokenizer`` and ``run_id``."""
        if layout.kind != "orchard" and (tokenizer is None or not run_id):
            raise DatasetError(f"layout {layout.name!r} needs --tokenizer and --run-id")
        self.producer, self.layout, self.run_id = producer, layout, run_id
        self.tokenizer, self.policy_version = tokenizer, policy_version
        self.codec = codec or Codec.default()
        self.topics = {"model_calls_topic": model_calls_topic, "outcomes_topic": outcomes_topic}
        self.dead_letters = DeadLetterRouter(producer, self.codec, topic=dead_letter_topic)
        self.stats = ImportStats()

    def import_files(
        self, paths: Iterable[Path], *, limit: int | None = None, on_row: Callable[[], None] | None = None
    ) -> ImportStats:
        """Import every row of ``paths`` in order (at most ``limit`` rows); ``on_row`` is told of each row."""
        started = time.perf_counter()
        columns = None if self.layout.kind == "orchard" else self.layout.columns()
        try:
            for path in paths:
                for row in iter_rows(Path(path), columns):
                    if limit is not None and self.stats.rows >= limit:
                        return self.stats
                    self.import_row(row)
                    if on_row is not None:
                        on_row()
                    if self.stats.rows % FLUSH_EVERY_ROWS == 0:
                        self.producer.flush()
        finally:
            self.producer.flush()
            self.stats.seconds = time.perf_counter() - started
        return self.stats

    def import_row(self, row: SourceRow) -> None:
        """Publish one row as an episode, or dead-letter it with the reason."""
        self.stats.rows += 1
        try:
            if row.data is None:
                raise RowError(row.error or "unreadable row", "MalformedRowError")
            if self.layout.kind == "orchard":
                self._publish_recorded(row.data)
            else:
                self._publish_chat(row, row.data)
        except RowError as exc:
            self._dead_letter(row, exc.reason, exc.error_type)

    def _publish_chat(self, source: SourceRow, data: Mapping[str, Any]) -> None:
        if self.tokenizer is None or not self.run_id:
            raise DatasetError(f"layout {self.layout.name!r} needs a tokenizer and a run id")
        fields = extract(data, self.layout)
        calls = self.tokenizer.split(fields.messages, fields.tools)
        episode_id = fields.episode_id or _derived_episode_id(self.run_id, source)
        task_id = fields.task_id or episode_id
        recorder = self._recorder(episode_id, task_id, f"dataset:{self.layout.name}", fields.model)
        with _ClosingOnRefusal(recorder, task_id):
            for call in calls:
                recorder.record_call(
                    messages=call.messages,
                    prompt_ids=call.prompt_ids,
                    completion_ids=call.completion_ids,
                    logprobs=(),
                    response_text=call.response_text,
                    tool_calls=call.tool_calls,
                    tools=fields.tools,
                    policy_version=self.policy_version,
                    finish_reason="tool_calls" if call.tool_calls else "stop",
                    retokenized=True,
                )
                self.stats.tokens += len(call.prompt_ids) + len(call.completion_ids)
            recorder.record_outcome(
                status="SUCCEEDED" if fields.success else "FAILED",
                reward=fields.reward,
                group_id=task_id,
                signals=fields.signals,
                artifact_uris=fields.artifact_uris,
                policy_version=self.policy_version,
            )
        self._count(recorder)

    def _publish_recorded(self, data: Mapping[str, Any]) -> None:
        calls = calls_from_row(data)
        try:
            identity = {k: str(data[k]) for k in ("run_id", "episode_id", "task_id", "group_id", "harness", "model")}
            status: EpisodeStatus = data["status"]
            reward, signals = float(data["reward"]), {s["name"]: float(s["value"]) for s in data["signals"] or []}
        except (KeyError, TypeError, ValueError) as exc:
            raise RowError(f"not an orchard-layout row: {type(exc).__name__}: {exc}") from exc
        if status not in get_args(EpisodeStatus):
            raise RowError(f"status: {status!r} is not one of {', '.join(get_args(EpisodeStatus))}")
        recorder = self._recorder(
            identity["episode_id"], identity["task_id"], identity["harness"], identity["model"], identity["run_id"]
        )
        with _ClosingOnRefusal(recorder, identity["group_id"]):
            for call in calls:
                recorder.record_call(
                    messages=call.messages,
                    prompt_ids=call.prompt_ids,
                    completion_ids=call.completion_ids,
                    logprobs=call.logprobs,
                    response_text=call.response_text,
                    tool_calls=call.tool_calls,
                    tools=call.tools,
                    policy_version=call.policy_version,
                    finish_reason=call.finish_reason,
                    conversation_id=call.conversation_id,
                    retokenized=call.retokenized,
                )
                self.stats.tokens += len(call.prompt_ids) + len(call.completion_ids)
            recorder.record_outcome(
                status=status,
                reward=reward,
                group_id=identity["group_id"],
                signals=signals,
                policy_version=data.get("policy_version"),
            )
        self._count(recorder)

    def _recorder(
        self, episode_id: str, task_id: str, harness: str, model: str | None, run_id: str = ""
    ) -> EpisodeRecorder:
        return EpisodeRecorder(
            self.producer,
            run_id=self.run_id or run_id,
            episode_id=episode_id,
            task_id=task_id,
            harness=harness,
            model=model or (self.tokenizer.name if self.tokenizer else "unknown"),
            codec=self.codec,
            **self.topics,
        )

    def _count(self, recorder: EpisodeRecorder) -> None:
        self.stats.episodes += 1
        self.stats.calls += recorder.published_calls

    def _dead_letter(self, row: SourceRow, reason: str, error_type: str) -> None:
        where = f"{row.path} row {row.number}"
        original = row.raw if row.raw is not None else json.dumps(row.data, default=str)
        record = Record(f"file:{row.path}", 0, row.number, now_ms(), None, original.encode("utf-8", "replace"))
        self.dead_letters.send(record, f"{where}: {reason}", error_type)
        self.stats.dead_lettered += 1
        self.stats.reasons[error_type] = self.stats.reasons.get(error_type, 0) + 1


class _ClosingOnRefusal:
    """Turns a record refused mid-episode (too large for the bus, or invalid for its schema) into a CANCELLED
    outcome, so no consumer waits for the episode, and a ``RowError``."""

    def __init__(self, recorder: EpisodeRecorder, group_id: str) -> None:
        self.recorder, self.group_id = recorder, group_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, RecordTooLargeError | SchemaValidationError | PrefixDeltaError):
            return False
        self.recorder.record_outcome(
            status="CANCELLED", reward=0.0, group_id=self.group_id, error=f"import refused: {exc}"
        )
        raise RowError(str(exc), type(exc).__name__) from exc


def _derived_episode_id(run_id: str, row: SourceRow) -> str:
    """A deterministic episode id for a row without one: re-importing the same file gives the same ids."""
    digest = hashlib.sha256(f"{run_id}\0{row.path.name}\0{row.number}".encode()).hexdigest()[:16]
    return f"{run_id}-{digest}"
