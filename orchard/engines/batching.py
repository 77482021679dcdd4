"""The batching scheduler: a bounded queue of requests and one worker thread that steps every running sequence.

Continuous batching, one step at a time:

1. **admit** queued requests, oldest first, while the running sequences leave room (``max_batch_size`` sequences
   in all; a request with ``n`` choices needs ``n``). A request joins the *cohort* of the current model version;
2. **step** each cohort: existing sequences decode one token together; newly admitted ones are prefilled (one
   left-padded forward pass) and join the same KV batch (``orchard.engines.kv_batch``);
3. **sample** every row with its own parameters (``orchard.engines.sampling``), detokenize, check stop
   conditions, and hand the token to the request's event queue on its asyncio loop;
4. **retire** finished or cancelled sequences from the KV batch.

A new policy version (``install``) becomes current between two steps. From then on new requests join a cohort on
the new weights, while the cohort on the old weights keeps stepping until its last sequence finishes and is then
dropped: a request always finishes on the version it started with, and no request waits for a drain. The weights of
the newest version that no cohort steps on any more are kept as a spare (``take_spare``), so that a reload can
overwrite them instead of allocating a copy of the model.

The queue is a lock-protected deque bounded by ``max_queue`` (an ``asyncio.Queue`` cannot be read from the worker
thread); ``submit`` on a full queue raises ``EngineOverloadedError`` (HTTP 503). Events cross back to asyncio with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from orchard.engines.detokenize import IncrementalDetokenizer, TokenDecoder
from orchard.engines.exceptions import EngineError, EngineOverloadedError, GenerationFailedError, InvalidRequestError
from orchard.engines.kv_batch import KVBatch
from orchard.engines.sampling import SamplingParams, SequenceSampler, sample_batch
from orchard.logging import get_logger

log = get_logger("engines.batching")

IDLE_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class ServingModel:
    """Weights being served and the policy version they are."""

    model: PreTrainedModel
    version: int


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token of choice ``index``, and the text it released (possibly empty)."""

    index: int
    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished choice: every sampled token, their raw logprobs, the text and why it stopped."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    policy_version: int


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """Choice ``completion.index`` finished; ``text`` is what was still held back."""

    completion: Completion
    text: str


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The request failed in the worker."""

    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass
class SchedulerStats:
    """Counters of the step loop; ``batch_sizes`` counts steps by the number of sequences they ran."""

    steps: int = 0
    tokens: int = 0
    prefills: int = 0
    prefilled_tokens: int = 0  # prompt tokens run through the model
    reused_tokens: int = 0  # prompt tokens served from the prefix cache instead
    max_batch: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    first_token_time: dict[int, float] = field(default_factory=dict)

    def record_step(self, sequences: int) -> None:
        """Count one step that ran ``sequences`` sequences."""
        self.steps += 1
        self.tokens += sequences
        self.max_batch = max(self.max_batch, sequences)
        self.batch_sizes[sequences] += 1


class GenerationHandle:
    """The asyncio side of one request: its events, as the worker produces them."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, n: int) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.n = n
        self.cancelled = False
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()

    def emit(self, event: Event) -> None:
        """Deliver ``event`` from the worker thread."""
        deliver([(self, event)])

    def _put(self, event: Event) -> None:
        self._events.put_nowait(event)

    def cancel(self) -> None:
        """Stop generating (the client went away); the worker drops the sequences at its next step."""
        self.cancelled = True

    async def events(self) -> AsyncIterator[Event]:
        """Events until every choice finished; raises ``GenerationFailedError`` if the worker failed."""
        finished = 0
        while finished < self.n:
            event = await self._events.get()
            if isinstance(event, ErrorEvent):
                raise GenerationFailedError(event.message)
            finished += isinstance(event, FinishEvent)
            yield event

    async def completions(self) -> list[Completion]:
        """Wait for every choice; return them in index order."""
        done = [event.completion async for event in self.events() if isinstance(event, FinishEvent)]
        return sorted(done, key=lambda c: c.index)


def deliver(events: list[tuple[GenerationHandle, Event]]) -> None:
    """Hand events to their handles' event loops from the worker thread: one wake-up per loop, not per event."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[GenerationHandle, Event]]] = {}
    for handle, event in events:
        by_loop.setdefault(handle._loop, []).append((handle, event))
    for loop, batch in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[GenerationHandle, Event]]) -> None:
    for handle, event in batch:
        handle._put(event)


@dataclass(eq=False)
class _Sequence:
    handle: GenerationHandle
    index: int
    sampler: SequenceSampler
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(eq=False)
class _Cohort:
    serving: ServingModel
    batch: KVBatch
    running: list[_Sequence] = field(default_factory=list)  # row order of the KV batch
    joining: list[_Sequence] = field(default_factory=list)  # admitted, not yet prefilled


class BatchScheduler:
    """Queues requests and generates them in batches on a worker thread; see the module docstring."""

    def __init__(
        self,
        serving: ServingModel,
        tokenizer: TokenDecoder,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int,
        max_queue: int,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.prefix_cache_bytes = prefix_cache_bytes
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.stats = SchedulerStats()
        self._current = serving
        self._pending: ServingModel | None = None
        self._retiring: list[ServingModel] = []  # replaced versions, until no cohort steps on them
        self._spare: ServingModel | None = None
        self._cohorts: list[_Cohort] = []
        self._queue: deque[GenerationHandle] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def serving(self) -> ServingModel:
        """The weights new requests are served with (a pending install counts)."""
        return self._pending or self._current

    @property
    def policy_version(self) -> int:
        """The version new requests are served with (a pending install counts)."""
        return self.serving.version

    @property
    def waiting(self) -> int:
        """Requests queued, not yet admitted."""
        return len(self._queue)

    @property
    def running(self) -> int:
        """Sequences being generated."""
        return sum(len(c.running) + len(c.joining) for c in self._cohorts)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._run, name="orchard-engine-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the worker; queued and running requests fail."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._fail_all("the engine is shutting down")

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> GenerationHandle:
        """Queue a request (from the event loop); ``EngineOverloadedError`` when the queue is full."""
        if n > self.max_batch_size:
            raise InvalidRequestError(f"n={n} exceeds the engine's max_batch_size of {self.max_batch_size}", "n")
        handle = GenerationHandle(prompt_ids, params, n)
        with self._wake:
            if self._stopping:
                raise EngineError("the engine is shutting down")
            if len(self._queue) >= self.max_queue:
                raise EngineOverloadedError(f"the request queue is full ({self.max_queue} waiting); retry later")
            self._queue.append(handle)
            self._wake.notify()
        return handle

    def install(self, serving: ServingModel) -> None:
        """Serve ``serving`` to requests admitted from the next step on (thread-safe)."""
        with self._wake:
            if self._pending is not None:  # replaced before it served a request
                self._retiring.append(self._pending)
            self._pending = serving
            self._wake.notify()

    def take_spare(self) -> PreTrainedModel | None:
        """The model of a replaced version that no request uses any more, now the caller's to overwrite (at most
        one is kept: the one drained last); None if there is none (thread-safe)."""
        with self._wake:
            spare, self._spare = self._spare, None
        return spare.model if spare is not None else None

    # -------------------------------------------------------------------------------------------- worker thread
    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                if not self._queue and self.running == 0 and self._pending is None:
                    self._wake.wait(IDLE_WAIT_S)
                    continue
                self._switch_version()
                self._admit()
            for cohort in list(self._cohorts):
                self._step_guarded(cohort)
            self._cohorts = [c for c in self._cohorts if c.running or c.joining or c.serving is self._current]
            if self._retiring:
                self._keep_drained()

    def _keep_drained(self) -> None:
        # by the model, not its wrapper: the same model may be installed again under another version
        in_use = {id(c.serving.model) for c in self._cohorts}
        with self._wake:
            in_use |= {id(s.model) for s in (self._current, self._pending) if s is not None}
            drained = [s for s in self._retiring if id(s.model) not in in_use]
            if drained:
                self._retiring = [s for s in self._retiring if id(s.model) in in_use]
                self._spare = drained[-1]

    def _switch_version(self) -> None:
        if self._pending is not None:
            previous, self._current, self._pending = self._current, self._pending, None
            self._retiring.append(previous)
            log.info("policy version installed", version=self._current.version, previous=previous.version)

    def _admit(self) -> None:
        free = self.max_batch_size - self.running
        while self._queue and (self._queue[0].n <= free or self._queue[0].cancelled):
            handle = self._queue.popleft()
            if handle.cancelled:
                continue
            cohort = self._cohort_for(self._current)
            for index in range(handle.n):
                sampler = SequenceSampler(handle.params, index)
                detokenizer = IncrementalDetokenizer(self.tokenizer, handle.params.stop)
                cohort.joining.append(_Sequence(handle, index, sampler, detokenizer))
            free -= handle.n

    def _cohort_for(self, serving: ServingModel) -> _Cohort:
        for cohort in self._cohorts:
            if cohort.serving is serving:
                return cohort
        cohort = _Cohort(serving, self._new_batch(serving))
        self._cohorts.append(cohort)
        return cohort

    def _new_batch(self, serving: ServingModel) -> KVBatch:
        """A KV batch on ``serving``'s weights, with a prefix cache of its own (keys of other weights never mix)."""
        return KVBatch(serving.model, self.pad_token_id, prefix_cache_bytes=self.prefix_cache_bytes)

    def _step_guarded(self, cohort: _Cohort) -> None:
        try:
            self._step(cohort)
        except Exception as exc:  # a failed step fails its requests, never the worker
            log.exception("generation step failed", version=cohort.serving.version)
            for seq in cohort.running + cohort.joining:
                seq.handle.emit(ErrorEvent(f"generation failed: {exc}"))
            cohort.running, cohort.joining = [], []
            cohort.batch = self._new_batch(cohort.serving)

    def _step(self, cohort: _Cohort) -> None:
        self._retire(cohort, [s for s in cohort.running if s.handle.cancelled])
        cohort.joining = [s for s in cohort.joining if not s.handle.cancelled]
        rows: list[_Sequence] = []
        logits = []
        if cohort.running:
            logits.append(cohort.batch.decode([s.token_ids[-1] for s in cohort.running]))
            rows += cohort.running
        if cohort.joining:
            before = cohort.batch.prefilled_tokens, cohort.batch.reused_tokens
            logits.append(cohort.batch.prefill([s.handle.prompt_ids for s in cohort.joining]))
            rows += cohort.joining
            self.stats.prefills += 1
            self.stats.prefilled_tokens += cohort.batch.prefilled_tokens - before[0]
            self.stats.reused_tokens += cohort.batch.reused_tokens - before[1]
            cohort.running, cohort.joining = cohort.running + cohort.joining, []
        if not rows:
            return
        tokens, logprobs = sample_batch(torch.cat(logits), [s.sampler for s in rows])
        self.stats.record_step(len(rows))
        self.stats.first_token_time.setdefault(cohort.serving.version, time.time())
        events: list[tuple[GenerationHandle, Event]] = []
        for seq, token, logprob in zip(rows, tokens, logprobs, strict=True):
            events += self._advance(seq, token, logprob, cohort.serving.version)
        deliver(events)
        self._retire(cohort, [s for s in cohort.running if s.finish_reason is not None])

    def _advance(
        self, seq: _Sequence, token: int, logprob: float, version: int
    ) -> list[tuple[GenerationHandle, Event]]:
        seq.token_ids.append(token)
        seq.logprobs.append(logprob)
        text = seq.detokenizer.push(token)
        if token in self.eos_token_ids or seq.detokenizer.stopped_by is not None:
            seq.finish_reason = "stop"
        elif len(seq.token_ids) >= seq.sampler.params.max_tokens:
            seq.finish_reason = "length"
        events: list[tuple[GenerationHandle, Event]] = [(seq.handle, TokenEvent(seq.index, token, logprob, text))]
        if seq.finish_reason is not None:
            completion = Completion(
                seq.index, seq.token_ids, seq.logprobs, seq.detokenizer.text, seq.finish_reason, version
            )
            events.append((seq.handle, FinishEvent(completion, seq.detokenizer.flush())))
        return events

    def _retire(self, cohort: _Cohort, leaving: list[_Sequence]) -> None:
        if leaving:
            gone = set(map(id, leaving))
            for row, seq in enumerate(cohort.running):
                if id(seq) in gone and seq.finish_reason is not None:  # fed: the prompt and all but the last token
                    cohort.batch.remember(row, seq.handle.prompt_ids + seq.token_ids[:-1])
            keep = [row for row, s in enumerate(cohort.running) if id(s) not in gone]
            cohort.batch.keep(keep)
            cohort.running = [cohort.running[row] for row in keep]

    def _fail_all(self, message: str) -> None:
        with self._wake:
            queued, self._queue = list(self._queue), deque()
        sequences = [s for c in self._cohorts for s in c.running + c.joining]
        for handle in {id(h): h for h in queued + [s.handle for s in sequences]}.values():
            handle.emit(ErrorEvent(message))
