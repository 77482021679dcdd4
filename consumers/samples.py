"""The sample builder: assembled trajectories and their dense scores become ``TrainingSample`` records.

Flow of one trajectory (all state in the ``StateStore``, so a restart resumes exactly where the last commit was):

1. **Arrive** (``trajectories`` topic). Incomplete trajectories, statuses not in ``train_statuses``, trajectories
   without calls and re-deliveries of an episode already seen are counted, logged and not trained on. The first
   three still join their rollout group as *empty* members (no reward, no samples), so a group closes once every
   episode started with it has arrived rather than on its timeout (a lockstep rollout counts on that). Otherwise the
   trajectory is reduced to a ``PreparedTrajectory`` (token sequences + per-call facts) and stored.
2. **Wait for scores** (``scores`` topic): until every scorer named in ``scorers`` or ``credit.score_credit`` is
   done with the episode, or ``score_wait_ms`` of event time has passed since the trajectory arrived (then the
   missing scorers count as silent, and what came of the others is used). Scores may arrive before their trajectory.
   A scorer commits all its scores of an episode in one transaction, so they are all on the bus once the first is,
   but they reach the processor one record at a time and may straddle polls. A scorer whose records carry
   ``episode_score_count`` (StepScore v2: every scorer Orchard runs) is done the moment that many have come, and
   not before (``score_wait_ms`` is then its only timeout); one whose records do not (v1 records, third-party
   scorers) counts as done ``score_settle_ms`` after its first score of the episode.
3. **Group** (``consumers.groups``): the ready trajectory joins its rollout group, which closes when it has
   ``group_size`` members or ``group_timeout_ms`` after it opened.
4. **Emit**, for each member of a closed group (in the order they joined) and each of its token sequences
   (``consumers.sequences``: one per conversation whose calls extend each other), in order:

   - an **RL** sample: loss mask on the completion tokens of calls that were not retokenized; per-token advantage
     ``outcome_weight * A_group + sum_s w_s * score_s(token)``, where ``A_group`` is the GRPO advantage of the
     episode's reward in its group (``consumers.advantages``: 0 when every member has the same reward) and the sum
     runs over dense scores (a call-level score covers the call's completion, a span score its span);
   - an **SFT** sample (if the trajectory passes ``sft_successful_only`` / ``sft_min_reward``): loss mask on every
     completion token, per-token weight = the credit weight of the call that generated it (``consumers.credit``;
     the "files the fix needed" are those the group's successful members edited). The credit facts are read from
     a trajectory's transcript on arrival only when ``kinds`` has SFT (they are most of the cost of a trajectory),
     so a trajectory that arrived while the builder made RL samples only, and is still waiting when it restarts
     with SFT, gets no SFT sample (counted as ``SFT_no_facts``).

   A sample whose advantages (RL) or weights (SFT) are all zero carries no signal and is skipped (counted) unless
   ``emit_zero_samples``. Each sample's ``sample_id`` is ``<episode>/<kind>/c<conversation>/<first>-<last call>``,
   so a replay produces the same ids and a consumer can deduplicate; ``created_at`` is the group's close time in
   event time; ``policy_version`` is the oldest version among the sequence's calls; ``behaviour_logprobs`` are 0
   where masked (and, in SFT samples, empty when a call was retokenized, as the schema says).

Determinism: every output derives from inputs. Event time is the newest input timestamp seen (kept in the store);
timers that fell due before an input's timestamp fire before that input is handled; ``punctuate`` can move time
further (the runtime passes stream time in replays, the wall clock when idle), which
closes timed-out groups and score waits without new input. Expired bookkeeping (scores whose trajectory never came,
remembered emitted episodes) is dropped after ``orphan_score_ms`` / ``dedupe_window_ms`` of event time.

Scaling: a group's members and their scores must reach the same instance. ``trajectories`` and ``scores`` are keyed
by task (``orchard.episode_groups.stream_key``) and the bus's groups hand partition *p* of both topics to one member,
so several instances of one consumer group share the work by task.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from consumers.advantages import DenseScore, baseline_dense_scores, dense_token_scores, group_advantages
from consumers.credit import CreditConfig, credit_steps, fix_files_of
from consumers.groups import ClosedGroup, GroupBuilder, GroupBy, Member, group_key
from consumers.processor import Emit, Input, Processor, RecordRejected, StateStore
from consumers.sample_state import PreparedTrajectory, ScoreBook
from consumers.sequences import TokenSequence
from orchard.episode_groups import is_eval_group
from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from orchard.tokens import pack_array
from orchard.topics import SAMPLES, SCORES, TRAJECTORIES
from orchard.trajectory import Trajectory
from orchard.trajectory_records import trajectory_from_record

log = get_logger("consumers.samples")
SampleKind = Literal["RL", "SFT"]
DenseBaseline = Literal["none", "call_index"]
_TRAJ, _WAIT, _SCORE, _DONE, _GROUP, _CLOCK = "traj/", "wait/", "score/", "done/", "group/", "clock"
SCORE_COUNT_FIELD = "episode_score_count"
"""The ``StepScore`` (v2) field giving how many records the scorer published for the episode (null: it does not say)."""


class SampleBuilderConfig(BaseModel):
    """Settings of the sample builder: which samples, grouping, scorer weights, score waiting, credit rules."""

    model_config = ConfigDict(extra="forbid")

    kinds: list[SampleKind] = Field(
        default_factory=lambda: ["RL"], min_length=1, description="Samples to produce: RL and/or SFT."
    )
    group_size: int = Field(8, ge=1, description="A rollout group closes once it has this many trajectories.")
    group_timeout_ms: int = Field(
        600_000, ge=0, description="...or this long (event time) after its first trajectory joined."
    )
    group_by: GroupBy = Field(
        "auto", description="'auto': group_id when set, else task + policy version; 'task_version': always the latter."
    )
    scorers: dict[str, float] = Field(
        default_factory=dict, description="Scorer name -> weight of its dense scores in RL advantages."
    )
    score_wait_ms: int = Field(
        120_000, ge=0, description="How long (event time) after a trajectory arrives to wait for its scorers."
    )
    score_settle_ms: int = Field(
        2_000,
        ge=0,
        description="A scorer whose records do not carry episode_score_count (StepScore v1, third-party scorers) "
        "counts as done with an episode this long (event time) after its first score for it; one whose records "
        "carry it is done once that many have come.",
    )
    dense_baseline: DenseBaseline = Field(
        "none",
        description="'call_index': subtract from each call-level dense score the mean of the other group "
        "members' scores at the same call index (consumers.advantages); 'none': add the scores as they are.",
    )
    outcome_weight: float = Field(1.0, description="Weight of the group-relative outcome advantage.")
    advantage_eps: float = Field(1e-6, gt=0, description="eps in (r - mean) / (std + eps).")
    normalise_std: bool = Field(True, description="Divide by the group's reward std (False: mean baseline only).")
    advantage_ddof: int = Field(
        0, ge=0, le=1, description="Std of the group's rewards over n - ddof: 0 population, 1 sample (as TRL's GRPO)."
    )
    credit: CreditConfig = Field(default_factory=CreditConfig, description="Credit-assignment rules (SFT weights).")
    sft_successful_only: bool = Field(False, description="SFT only on successful trajectories (demonstrations).")
    sft_min_reward: float | None = Field(None, description="SFT only on trajectories with at least this reward.")
    train_statuses: list[str] = Field(
        default_factory=lambda: ["SUCCEEDED", "FAILED", "TIMED_OUT"],
        description="Episode statuses trained on; others (CRASHED, CANCELLED) are counted and skipped.",
    )
    emit_zero_samples: bool = Field(False, description="Also emit samples whose advantages/weights are all zero.")
    orphan_score_ms: int = Field(
        3_600_000, ge=0, description="Drop scores of an episode whose trajectory has not come after this long."
    )
    dedupe_window_ms: int = Field(
        3_600_000, ge=0, description="Remember emitted episodes this long, to drop re-delivered trajectories."
    )

    @field_validator("scorers")
    @classmethod
    def _finite_weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {name: weight for name, weight in value.items() if not math.isfinite(weight)}
        if bad:
            raise ValueError(f"scorer weights must be finite numbers, got {bad}")
        return value

    @property
    def awaited_scorers(self) -> tuple[str, ...]:
        """Scorers whose scores a trajectory waits for (weighted in RL, or used as credit)."""
        return tuple(sorted(set(self.scorers) | set(self.credit.score_credit)))


class SampleBuilder(Processor):
    """Trajectories + dense scores -> ``TrainingSample`` records (see the module docstring)."""

    name: ClassVar[str] = "sample-builder"
    input_topics: ClassVar[tuple[str, ...]] = (TRAJECTORIES, SCORES)
    output_topics: ClassVar[tuple[str, ...]] = (SAMPLES,)

    def __init__(self, config: SampleBuilderConfig | None = None) -> None:
        """A builder with ``config`` (defaults: RL samples, groups of 8, no scorers)."""
        self.config = config or SampleBuilderConfig()
        self.stats: Counter[str] = Counter()
        self._awaited = self.config.awaited_scorers
        self._state: StateStore | None = None

    # ------------------------------------------------------------------ Processor
    def open(self, state: StateStore) -> None:
        """Rebuild the in-memory indexes from the store (also after the runtime rolls a record back)."""
        self._state = state
        self._groups = GroupBuilder(self.config.group_size, self.config.group_timeout_ms, state, prefix=_GROUP)
        self._groups.restore()
        self._clock = 0
        self._waiting: dict[str, tuple[int, str, int | None]] = {}  # episode -> (score deadline, group key, partition)
        self._wait_heap: list[tuple[int, str]] = []
        self._heard: dict[str, dict[str, int | None]] = {}  # episode -> scorer -> when it is done (None: not yet)
        self._settle_heap: list[tuple[int, str]] = []
        self._orphan_heap: list[tuple[int, str]] = []
        self._done: dict[str, int] = {}
        self._done_heap: list[tuple[int, str]] = []
        for key, value in state.items():
            self._index(key, value)

    def process(self, message: Input, emit: Emit) -> None:
        """Take a trajectory or a score, then emit whatever that completed."""
        if message.schema not in ("Trajectory", "StepScore"):
            raise RecordRejected(f"the sample builder reads Trajectory and StepScore records, not {message.schema}")
        state = self._store()
        if message.timestamp_ms > self._clock:
            self._advance(message.timestamp_ms - 1, emit)  # what fell due before this input happened first
            self._clock = message.timestamp_ms
            state.put(_CLOCK, str(self._clock).encode())
        if message.schema == "Trajectory":
            # arrival = the clock, not the record's own time: a record from a lagging partition still gets its
            # whole score wait
            trajectory = _trajectory_of(message, messages="SFT" in self.config.kinds)
            self._on_trajectory(trajectory, self._clock, message.partition, emit)
        else:
            self._on_score(message.record, emit)
        self._advance(self._clock, emit)

    def punctuate(self, now_ms: int, emit: Emit) -> None:
        """Close score waits and groups that timed out by ``now_ms`` (not stored: only inputs move the clock)."""
        self._advance(max(self._clock, now_ms), emit)

    # ------------------------------------------------------------------ inputs
    def _on_trajectory(self, trajectory: Trajectory, arrived_ms: int, partition: int, emit: Emit) -> None:
        episode = trajectory.episode_id
        skip = self._skip_reason(trajectory)
        if skip is not None:
            self.stats[skip] += 1
            log.info("trajectory not trained on", episode_id=episode, reason=skip, detail=trajectory.incomplete_reason)
            # one of its group's episodes all the same: the group is not left waiting for it until its timeout
            if skip not in ("duplicate", "evaluation") and trajectory.group_id:
                with self._store().at_partition(partition):
                    closed = self._groups.add(
                        group_key(trajectory, self.config.group_by), Member(episode, arrived_ms, empty=True)
                    )
                if closed is not None:
                    self._emit_group(closed, emit)
            return
        state = self._store()
        prepared = PreparedTrajectory.of(trajectory, arrived_ms, facts="SFT" in self.config.kinds)
        state.put(_TRAJ + episode, prepared.to_bytes())
        deadline = arrived_ms + self.config.score_wait_ms
        group = group_key(trajectory, self.config.group_by)
        state.put(_WAIT + episode, json.dumps([deadline, group, partition]).encode())
        self._index_wait(episode, deadline, group, partition)
        self.stats["trajectories"] += 1
        self._join_if_scored(episode, emit)

    def _skip_reason(self, trajectory: Trajectory) -> str | None:
        episode = trajectory.episode_id
        if episode in self._done or self._store().get(_TRAJ + episode) is not None:
            return "duplicate"  # already emitted, or waiting for scores or for its group
        if not trajectory.complete:
            return "incomplete"
        if is_eval_group(trajectory.group_id):
            return "evaluation"  # held-out episodes measure the policy; training on them would leak the eval split
        if trajectory.status not in self.config.train_statuses:
            return f"status_{trajectory.status}"
        return None if trajectory.steps else "no_calls"

    def _on_score(self, record: Mapping[str, Any], emit: Emit) -> None:
        scorer, episode = record["scorer"], record["episode_id"]
        if scorer not in self._awaited:
            self.stats["scores_unused"] += 1
            return
        if episode in self._done:
            self.stats["scores_late"] += 1
            log.info("score arrived after its episode's samples", episode_id=episode, scorer=scorer)
            return
        state, key = self._store(), f"{_SCORE}{episode}|{scorer}"
        raw = state.get(key)
        book = ScoreBook.from_bytes(raw) if raw is not None else ScoreBook(scorer, self._clock)
        book.expect(record.get(SCORE_COUNT_FIELD), self._clock)
        span = (record.get("token_start"), record.get("token_end"))
        book.add(record["call_index"], *span, float(record["score"]), now_ms=self._clock)
        state.put(key, book.to_bytes())
        self._index_score(episode, book)
        self._join_if_scored(episode, emit)

    # ------------------------------------------------------------------ time
    def _advance(self, now_ms: int, emit: Emit) -> None:
        """Handle, in event-time order, every scorer settling, score wait timeout and group timeout due by
        ``now_ms`` (at equal times in that order: a trajectory ready at T still joins a group closing at T)."""
        while True:
            settle = _peek(self._settle_heap, lambda t, episode: episode in self._waiting)
            wait = _peek(self._wait_heap, lambda t, episode: self._waiting.get(episode, (None,))[0] == t)
            events = [(settle, 0), (wait, 1), (self._groups.next_deadline(), 2)]
            due = [(t, kind) for t, kind in events if t is not None and t <= now_ms]
            if not due:
                break
            t, kind = min(due)
            if kind == 0:
                episode = heapq.heappop(self._settle_heap)[1]
                ready = self._ready_at(episode)
                if ready is not None and ready <= t:
                    self._join(episode, t, emit, timed_out=False)
            elif kind == 1:
                self._join(heapq.heappop(self._wait_heap)[1], t, emit, timed_out=True)
            else:
                for group in self._groups.expire(t):
                    self._emit_group(group, emit)
        self._expire_orphans(now_ms)
        self._expire_done(now_ms)

    def _ready_at(self, episode: str) -> int | None:
        """When every awaited scorer counts as done with ``episode`` (None: some has not been heard from, or is
        still missing records it announced)."""
        heard = self._heard.get(episode, {})
        times = [heard.get(scorer) for scorer in self._awaited]
        return None if None in times else max((t for t in times if t is not None), default=0)

    def _join_if_scored(self, episode: str, emit: Emit) -> None:
        ready = self._ready_at(episode)
        if episode not in self._waiting or ready is None:
            return
        if ready <= self._clock:
            self._join(episode, self._clock, emit, timed_out=False)
        else:  # scores that came before their trajectory: their settle entries were dropped as nobody waited
            heapq.heappush(self._settle_heap, (ready, episode))

    def _join(self, episode: str, joined_ms: int, emit: Emit, *, timed_out: bool) -> None:
        _, group, home = self._waiting.pop(episode)
        self._store().delete(_WAIT + episode)
        if timed_out:
            heard = self._heard.get(episode, {})
            missing = [s for s in self._awaited if s not in heard]
            unfinished = [s for s in self._awaited if s in heard and heard[s] is None]
            self.stats["score_wait_timeouts"] += 1
            log.warning("gave up waiting for scorers", episode_id=episode, missing=missing, unfinished=unfinished)
        with self._store().at_partition(home):  # a timer may join it while another partition's input is handled
            closed = self._groups.add(group, Member(episode, joined_ms))
            if closed is not None:
                self._emit_group(closed, emit)

    # ------------------------------------------------------------------ output
    def _emit_group(self, group: ClosedGroup, emit: Emit) -> None:
        state = self._store()
        trained = [member for member in group.members if not member.empty]
        if not trained:  # every episode of the group was one not trained on
            self.stats["groups_without_trainable_members"] += 1
            log.info("group closed", group=group.key, reason=group.reason, size=0, samples=0,
                     skipped=len(group.members))  # fmt: skip
            return
        with state.at_partition(state.home(_TRAJ + trained[0].episode_id)):  # the members' partition
            self._emit_closed(group, trained, emit)

    def _emit_closed(self, group: ClosedGroup, trained: list[Member], emit: Emit) -> None:
        state = self._store()
        members = [PreparedTrajectory.from_bytes(_required(state, _TRAJ + m.episode_id)) for m in trained]
        advantages = group_advantages(
            [m.reward for m in members], eps=self.config.advantage_eps, normalise_std=self.config.normalise_std,
            ddof=self.config.advantage_ddof,
        )  # fmt: skip
        fix_files = fix_files_of(m.facts for m in members if m.success and m.facts is not None)
        books = [self._books(member.episode_id) for member in members]
        dense = [[score for book in member_books for score in book.dense_scores()] for member_books in books]
        if self.config.dense_baseline == "call_index":
            dense = baseline_dense_scores(dense)
        emitted = 0
        for member, advantage, member_books, member_dense in zip(members, advantages, books, dense, strict=True):
            for sample in self._samples(member, advantage, member_books, member_dense, fix_files, group.closed_ms):
                emit(SAMPLES, "TrainingSample", sample, key=member.episode_id)
                emitted += 1
            self._forget(member.episode_id, group.closed_ms)
        self.stats["groups"] += 1
        self.stats["samples"] += emitted
        log.info(
            "group closed", group=group.key, reason=group.reason, size=len(members), samples=emitted,
            rewards=[m.reward for m in members], skipped=len(group.members) - len(members),
        )  # fmt: skip

    def _samples(
        self,
        member: PreparedTrajectory,
        advantage: float,
        books: list[ScoreBook],
        dense: list[DenseScore],
        fix_files: frozenset[str],
        created_ms: int,
    ) -> Iterator[dict[str, Any]]:
        config = self.config
        call_weights = None
        if "SFT" in config.kinds and self._sft_eligible(member) and member.facts is not None:
            step_scores = {book.scorer: book.call_scores() for book in books}
            credits = credit_steps(
                member.facts, config.credit, success=member.success, status=member.status, signals=member.signals,
                step_scores=step_scores, fix_files=fix_files,
            )  # fmt: skip
            call_weights = {credit.call_index: credit.weight for credit in credits}
        for sequence in member.sequences:
            if "RL" in config.kinds:
                yield from self._rl_sample(member, sequence, advantage, dense, created_ms)
            if call_weights is not None:
                yield from self._sft_sample(member, sequence, call_weights, created_ms)

    def _rl_sample(
        self, member: PreparedTrajectory, sequence: TokenSequence, advantage: float, dense: list[DenseScore], at: int
    ) -> Iterator[dict[str, Any]]:
        mask = sequence.completion_mask(include_retokenized=False)
        values = self.config.outcome_weight * advantage + dense_token_scores(sequence, dense, self.config.scorers)
        values = (values * mask).astype(np.float32)
        if self._keep(mask, values, "RL"):
            yield sample_record(member, sequence, "RL", mask, values, sequence.logprobs * mask, at)

    def _sft_sample(
        self, member: PreparedTrajectory, sequence: TokenSequence, call_weights: Mapping[int, float], at: int
    ) -> Iterator[dict[str, Any]]:
        mask = sequence.completion_mask()
        weights = np.zeros(len(sequence.token_ids), dtype=np.float32)
        for span in sequence.spans:
            weights[span.start : span.end] = call_weights.get(span.call_index, 0.0)
        if self._keep(mask, weights, "SFT"):
            retokenized = any(span.retokenized for span in sequence.spans)
            logprobs = None if retokenized else sequence.logprobs * mask
            yield sample_record(member, sequence, "SFT", mask, weights, logprobs, at)

    def _keep(self, mask: np.ndarray, values: np.ndarray, kind: str) -> bool:
        if not mask.any():
            self.stats[f"{kind}_no_trainable_tokens"] += 1
            return False
        if not self.config.emit_zero_samples and not values.any():
            self.stats[f"{kind}_zero_signal"] += 1
            return False
        return True

    def _sft_eligible(self, member: PreparedTrajectory) -> bool:
        if member.facts is None:  # prepared by this builder while it made RL samples only
            self.stats["SFT_no_facts"] += 1
            return False
        if self.config.sft_successful_only and not member.success:
            return False
        return self.config.sft_min_reward is None or member.reward >= self.config.sft_min_reward

    # ------------------------------------------------------------------ state
    def _store(self) -> StateStore:
        if self._state is None:
            raise RuntimeError("SampleBuilder.open(state) must be called before processing")
        return self._state

    def _index(self, key: str, value: bytes) -> None:
        if key == _CLOCK:
            self._clock = int(value)
        elif key.startswith(_WAIT):
            deadline, group, *partition = json.loads(value)  # stored without its partition before stop 26
            home = partition[0] if partition else self._store().home(key)
            self._index_wait(key[len(_WAIT) :], deadline, group, home)
        elif key.startswith(_SCORE):
            self._index_score(key[len(_SCORE) :].rpartition("|")[0], ScoreBook.from_bytes(value))
        elif key.startswith(_DONE):
            self._index_done(key[len(_DONE) :], int(value))

    def _index_wait(self, episode: str, deadline: int, group: str, home: int | None) -> None:
        self._waiting[episode] = (deadline, group, home)
        heapq.heappush(self._wait_heap, (deadline, episode))

    def _index_score(self, episode: str, book: ScoreBook) -> None:
        heard = self._heard.setdefault(episode, {})
        if book.scorer not in heard:
            heapq.heappush(self._orphan_heap, (book.first_ms + self.config.orphan_score_ms, episode))
        ready = book.ready_ms(self.config.score_settle_ms)
        if book.scorer not in heard or heard[book.scorer] != ready:
            heard[book.scorer] = ready
            if ready is not None:
                heapq.heappush(self._settle_heap, (ready, episode))

    def _index_done(self, episode: str, done_ms: int) -> None:
        self._done[episode] = done_ms
        heapq.heappush(self._done_heap, (done_ms + self.config.dedupe_window_ms, episode))

    def _books(self, episode: str) -> list[ScoreBook]:
        state = self._store()
        scorers = sorted(self._heard.get(episode, {}))
        return [ScoreBook.from_bytes(_required(state, f"{_SCORE}{episode}|{scorer}")) for scorer in scorers]

    def _forget(self, episode: str, done_ms: int) -> None:
        state = self._store()
        state.delete(_TRAJ + episode)
        for scorer in self._heard.pop(episode, {}):
            state.delete(f"{_SCORE}{episode}|{scorer}")
        state.put(_DONE + episode, str(done_ms).encode())
        self._index_done(episode, done_ms)

    def _expire_orphans(self, now_ms: int) -> None:
        while self._orphan_heap and self._orphan_heap[0][0] <= now_ms:
            _, episode = heapq.heappop(self._orphan_heap)
            if episode in self._waiting or self._store().get(_TRAJ + episode) is not None:
                continue  # its trajectory is here: the scores go when its group is emitted
            for scorer in self._heard.pop(episode, {}):
                self._store().delete(f"{_SCORE}{episode}|{scorer}")
                self.stats["scores_orphaned"] += 1

    def _expire_done(self, now_ms: int) -> None:
        while self._done_heap and self._done_heap[0][0] <= now_ms:
            deadline, episode = heapq.heappop(self._done_heap)
            if self._done.get(episode) is not None and self._done[episode] + self.config.dedupe_window_ms == deadline:
                del self._done[episode]
                self._store().delete(_DONE + episode)


def sample_record(
    member: PreparedTrajectory,
    sequence: TokenSequence,
    kind: SampleKind,
    mask: np.ndarray,
    values: np.ndarray,
    logprobs: np.ndarray | None,
    created_ms: int,
) -> dict[str, Any]:
    """The ``TrainingSample`` record of one sequence (packed arrays as bytes)."""
    return {
        "run_id": member.run_id,
        "episode_id": member.episode_id,
        "task_id": member.task_id,
        "group_id": member.group_id,
        "sample_id": sample_id(member.episode_id, kind, sequence),
        "kind": kind,
        "policy_version": sequence.oldest_policy_version,
        "token_ids": pack_array(sequence.token_ids, "int32"),
        "loss_mask": pack_array(mask.astype(np.uint8), "uint8"),
        "advantages": pack_array(values.astype(np.float32), "float32"),
        "behaviour_logprobs": b"" if logprobs is None else pack_array(logprobs.astype(np.float32), "float32"),
        "reward": member.reward,
        "created_at": created_ms,
    }


def sample_id(episode_id: str, kind: str, sequence: TokenSequence) -> str:
    """``<episode>/<kind>/c<conversation>/<first call>-<last call>``: the same source gives the same id."""
    return f"{episode_id}/{kind}/c{sequence.conversation_id}/{sequence.first_call}-{sequence.last_call}"


def _trajectory_of(message: Input, *, messages: bool) -> Trajectory:
    """The in-memory trajectory a ``Trajectory`` record carries (a record that cannot be read is rejected); without
    ``messages`` (RL samples only: no credit facts to read) its steps' request messages are left empty."""
    try:
        return trajectory_from_record(message.record, messages=messages)
    except (OrchardError, KeyError, TypeError, ValueError) as exc:
        raise RecordRejected(f"unreadable Trajectory record: {type(exc).__name__}: {exc}", type(exc).__name__) from exc


def _peek(heap: list[tuple[int, str]], valid: Callable[[int, str], bool]) -> int | None:
    """The time of the first valid entry of ``heap`` (invalid ones are dropped on the way), or None."""
    while heap and not valid(*heap[0]):
        heapq.heappop(heap)
    return heap[0][0] if heap else None


def _required(state: StateStore, key: str) -> bytes:
    value = state.get(key)
    if value is None:
        raise RuntimeError(f"sample builder state is missing {key!r}")
    return value
