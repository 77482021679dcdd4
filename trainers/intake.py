"""``SampleIntake``: which ``TrainingSample`` records a policy trainer trains on, decoded into ``Sample``s.

A record is skipped (counted, logged) when it is another run's, of a kind the trainer does not train (``loss.kind``),
longer than ``max_sample_tokens`` or holds token ids outside the model's vocabulary; undecodable and inconsistent
records also go to the dead-letter topic. With ``skip_zero_advantage`` an RL sample whose advantages are all zero on
its loss tokens is skipped too (``samples_skipped_zero_advantage``, no warning: it is the normal fate of a uniform
group, and it carries no gradient when the loss has no KL term). A record read again (a replayed pass, a restarted
stage) is judged again quietly: its letter, count and log line were written the first time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from orchard.bus import Record
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.codec import Codec
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from trainers.batching import Sample, sample_from_record
from trainers.exceptions import InvalidSampleError
from trainers.metrics import TrainerMetrics

log = get_logger("trainers.intake")


@dataclass
class SampleIntake:
    """The checks of one trainer: its run, the kind it trains, and what its model can take."""

    run_id: str
    kind: Literal["auto", "sft", "rl"]
    vocab_size: int
    max_sample_tokens: int | None
    codec: Codec
    metrics: TrainerMetrics
    skip_zero_advantage: bool = False

    def take(self, record: Record, router: DeadLetterRouter) -> Sample | None:
        """The record's sample, or None (dead-lettered, or skipped with a count and a log line)."""
        decoded = router.decode(record, "TrainingSample")
        if decoded is None:
            self.metrics.count("samples_skipped")
            return None
        fields = decoded.record
        reason = self.skip_reason(fields)
        if reason is None:
            try:
                sample = sample_from_record(fields)
            except InvalidSampleError as exc:
                router.send(record, str(exc), type(exc).__name__)
                self.metrics.count("samples_skipped")
                return None
            reason = self.shape_problem(sample)
            if reason is None and self.uninformative(sample):
                self.metrics.count("samples_skipped_zero_advantage")
                return None
            if reason is None:
                return sample
        log.warning("sample skipped", sample_id=fields["sample_id"], reason=reason, offset=record.offset)
        self.metrics.count("samples_skipped")
        return None

    def retake(self, record: Record) -> Sample | None:
        """A record read again: its sample, or None, quietly (the first read wrote the letter, count and log)."""
        try:
            decoded = self.codec.decode(record.value)
            if decoded.name != "TrainingSample" or self.skip_reason(decoded.record) is not None:
                return None
            sample = sample_from_record(decoded.record)
        except (SerializationError, InvalidSampleError):
            return None
        return sample if self.shape_problem(sample) is None and not self.uninformative(sample) else None

    def uninformative(self, sample: Sample) -> bool:
        """Whether ``sample`` is an RL sample with no non-zero advantage on a loss token (and such are skipped)."""
        if not self.skip_zero_advantage or sample.kind != "RL":
            return False
        return not bool(np.any(sample.advantages[1:][sample.loss_mask[1:] > 0] != 0.0))

    def shape_problem(self, sample: Sample) -> str | None:
        """Why the model cannot take ``sample`` (too long, token ids outside its vocabulary), or None."""
        if self.max_sample_tokens is not None and sample.num_tokens > self.max_sample_tokens:
            return f"{sample.num_tokens} tokens, over max_sample_tokens={self.max_sample_tokens}"
        low, high = int(sample.token_ids.min()), int(sample.token_ids.max())
        if low < 0 or high >= self.vocab_size:
            return f"token ids in [{low}, {high}] outside the model's vocabulary of {self.vocab_size}"
        return None

    def skip_reason(self, fields: dict[str, Any]) -> str | None:
        """Why this trainer does not train the decoded record (another run, another kind), or None."""
        if fields["run_id"] != self.run_id:
            return f"run {fields['run_id']!r}, this trainer trains run {self.run_id!r}"
        if self.kind != "auto" and fields["kind"] != self.kind.upper():
            return f"a {fields['kind']} sample, this trainer trains {self.kind.upper()} only (loss.kind)"
        return None
