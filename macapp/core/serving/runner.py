"""Serve completion requests on the engine's worker: batched where they can be, with prompt checkpoints.

    serving = ServingEngine(engine, ServingOptions(session=SessionOptions(context_limit=32768)))
    prepared = serving.prepare(request)   # any thread: rendered and checked once (EngineError if it cannot run)
    job = serving.submit(prepared)        # a Job (macapp.core.engine); QueueFull beyond the batch and queue limits
    for event in job.events(): ...        # RequestStarted, PromptProgress, ReasoningDelta, AnswerDelta, StatsUpdate,
                                          # ToolCallStarted + ToolCallFinished, then Completed | Failed
    job.stop()                            # a client that went away: Completed(CANCELLED) within about a token

Each request is rendered through the model's chat template once (prepared.py: the context and memory checks and
the max_tokens clamp come with it), restored from the longest checkpoint of its prompt (pool.py) and read from
there, a checkpoint taken at each boundary on the way. Every request is a sequence of the engine's batch loop
(`sequence`; engine/batch.py), as every chat turn is: alone, or beside others in mlx-lm's BatchGenerator, up to
`batch_limit` decoding together; a request with pictures runs alone while the batch waits. The answer text goes
through the tool-call parser and the stop sequences (reply_text.py).

Chat sessions keep their own caches; the pool holds only the API's.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError, Job, LoadedModel, SessionOptions, TurnClock
from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import StreamedReply
from macapp.core.engine.batch import DEFAULT_LIMIT, BatchLoop
from macapp.core.engine.sequence import SegmentEnd, Sequence
from macapp.core.engine.reply import Limits, SequenceReply
from macapp.core.engine.options import MTPMode
from macapp.core.sampling import make_sampler_and_processors
from macapp.core.engine.limits import context_limit, kv_quantization
from macapp.core.fit import estimate
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.events import PromptProgress
from macapp.core.serving import pictures as request_pictures
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.prompt_disk.shelf import ModelShelf
from macapp.core.prompt_disk.store import DiskStore
from macapp.core.serving.pool import CheckpointPool
from macapp.core.serving.prepared import PreparedRequest, RunSettings, prepare, prompt_length, render_for, run_settings
from macapp.core.serving.render import RenderedPrompt
from macapp.core.serving.reply_text import ReplyText, cancelled, completed
from macapp.core.serving.requests import CompletionRequest, RequestStarted, Usage

if TYPE_CHECKING:
    import mlx.core as mx

MIN_POOL_BYTES = 256 * 1024**2
FALLBACK_POOL_BYTES = 2 * 1024**3  # when the memory budget is unknown
POOL_SHARE = 0.25  # of the memory budget the weights leave
FIRST_GUESS_S = 10.0  # a request's duration before one was measured (for Retry-After)


@dataclass(frozen=True)
class ServingOptions:
    session: SessionOptions = field(default_factory=SessionOptions)  # context limit, KV quantization, prefill step, budget
    queue_limit: int = 8  # requests that may wait beyond the batch; beyond it submit raises QueueFull
    pool_bytes: int | None = None  # None: POOL_SHARE of the memory budget the weights leave (at least MIN_POOL_BYTES)
    parallel: int | None = None  # at most this many sequences in the batch (None: as many as fit, estimate.parallel_sequences)
    batching: bool = True  # False: every request one at a time (several Macs: the lockstep layer runs one call at a time)
    disk: DiskStore | None = None  # the checkpoints on disk too (macapp.core.prompt_disk), shared with the window


class QueueFull(Exception):
    """Too many requests are waiting; `retry_after_s` estimates when one more would be taken."""

    def __init__(self, retry_after_s: float, message: str = ""):
        super().__init__(message or "The server is busy: too many requests are waiting for the model.")
        self.retry_after_s = retry_after_s


class ServingEngine:
    """Completion requests on an Engine's loaded model."""

    def __init__(self, engine: Engine, options: ServingOptions | None = None):
        self.engine = engine
        self.options = options or ServingOptions()
        self.pool = CheckpointPool(self.options.pool_bytes or 0)
        engine.hold_caches(self.pool)  # freed before another model loads
        self._sized = self.options.pool_bytes is not None
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not yet ended (the running ones included)
        self._mean_s = FIRST_GUESS_S  # a request's measured duration, from its start to its end (EWMA)
        self._limit_for: LoadedModel | None = None  # the model the batch limit was sized for
        self._limit = 1
        self._mtp_model: LoadedModel | None = None  # the model `_mtp_policy` measures (worker thread only)
        self._mtp_policy = DepthPolicy(self.options.session.mtp)
        self._closed = False

    # -- any thread ------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        loaded = self.engine.loaded
        return loaded.name if loaded is not None else ""

    @property
    def context_limit(self) -> int:
        """The context a request's prompt and reply must fit in (0 with no model loaded)."""
        loaded = self.engine.loaded
        if loaded is None:
            return 0
        return min(self.options.session.context_limit or loaded.max_context, loaded.max_context)

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def batch_limit(self) -> int:
        """How many requests decode together: what fits beside the weights at the context limit (one sequence's KV
        cache grows with it; its DeltaNet state is fixed), at most --parallel; 1 without batching."""
        m = self.engine.model
        if not self.options.batching or m is None:
            return 1
        with self._lock:
            if self._limit_for is not m:
                self._limit = self._fitting(m)
                self._limit_for = m
            return self._limit

    @property
    def batch(self) -> BatchLoop:
        """The engine's batch loop these requests are sequences of."""
        return self.engine.batch_loop()

    def _fitting(self, m: LoadedModel) -> int:
        opts = self.options.session
        budget = opts.memory_budget_bytes or self.engine.memory_budget_bytes()
        most = DEFAULT_LIMIT
        if budget and m.arch is not None:
            most = estimate.parallel_sequences(
                m.arch,
                m.weights_bytes,
                budget,
                self.context_limit,
                opts.kv_bits,
                opts.prefill_step_size,
                reserved=self.options.pool_bytes or 0,
            )
        if self.options.parallel is not None:
            most = min(most, self.options.parallel)
        return max(1, min(most, DEFAULT_LIMIT))

    def count_tokens(self, request: CompletionRequest) -> int:
        """The prompt's length as the template renders it. Only the tokenizer is read (no MLX): any thread.
        EngineError NO_MODEL or INVALID_REQUEST (what the template or the tool choice refuses), as submit's job would."""
        m = self._model()
        return prompt_length(m, render_for(m, request))

    def prepare(self, request: CompletionRequest) -> PreparedRequest:
        """Render and check `request` once (any thread: only the tokenizer is read): EngineError NO_MODEL,
        INVALID_REQUEST, CONTEXT_LIMIT or MEMORY_BUDGET before any work; max_tokens clamped to the room left."""
        m = self._model()
        prepared = prepare(m, request, self.context_limit)
        opts = self.options.session
        kv_quantization(m, opts)  # a KV quantization this model cannot take is refused here, not mid-request
        context_limit(m, opts, prepared.prompt_tokens, 0, opts.memory_budget_bytes or self.engine.memory_budget_bytes())
        return prepared

    def submit(self, request: PreparedRequest | CompletionRequest) -> Job:
        """Start a prepared request (a plain CompletionRequest is prepared here, on the calling thread)."""
        limit = self.batch_limit
        with self._lock:
            waiting = self._pending - limit
            if waiting >= self.options.queue_limit:
                raise QueueFull(self._retry_after(waiting, limit))
            self._pending += 1
        try:
            if isinstance(request, CompletionRequest):
                try:
                    request = self.prepare(request)
                except EngineError as exc:
                    return self._failed(exc)
            job = self._start(request)
        except BaseException:  # a closed engine
            with self._lock:
                self._pending -= 1
            raise
        return job

    def _retry_after(self, waiting: int, limit: int) -> float:
        """When one more request would be taken: the ones waiting go `limit` at a time, each batch about as long as
        a request takes from its start to its end."""
        return self._mean_s * math.ceil((waiting + 1) / max(1, limit))

    def _start(self, prepared: PreparedRequest) -> Job:
        job = self.engine.new_job("serve")
        job.add_listener(self._on_event)
        started = time.perf_counter()
        batch = self.engine.batch_loop()
        batch.limit = self.batch_limit  # sized for this server
        batch.prefill_step = self.options.session.prefill_step_size
        batch.add(job, lambda m: self.sequence(job, prepared, m, started))
        return job

    def _failed(self, exc: EngineError) -> Job:
        job = self.engine.new_job("serve")
        job.add_listener(self._on_event)
        job.emit(ev.Failed(exc.message, exc.code))
        job.settle()
        return job

    def close(self) -> None:
        """Drop the checkpoints (on the worker, after the requests already submitted)."""
        self._closed = True

        def work(job: Job) -> None:
            self.pool.clear()
            job.emit(ev.Unloaded(memory_bytes=0))

        try:
            self.engine.submit("serve-close", work)
        except RuntimeError:  # the engine is closed: it dropped everything already
            self.pool.clear()

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.TerminalEvent):
            with self._lock:
                self._pending -= 1

    def measured(self, seconds: float) -> None:
        """A request took `seconds` from its start to its end (for Retry-After)."""
        with self._lock:
            self._mean_s = 0.7 * self._mean_s + 0.3 * seconds

    # -- worker ----------------------------------------------------------------------------------------
    def _model(self) -> LoadedModel:
        model = self.engine.model
        if model is None:
            raise EngineError("No model is loaded: load a model first.", ev.NO_MODEL)
        return model

    def current(self, prepared: PreparedRequest) -> PreparedRequest:
        """`prepared` for the model loaded now (prepared again if another was loaded since)."""
        m = self._model()
        return prepared if prepared.model is m else self.prepare(prepared.request)

    def settings(self, m: LoadedModel, prepared: PreparedRequest, prompt_len: int) -> RunSettings:
        """How the request runs: its sampling (max_tokens within the room the prompt leaves), budget and limit."""
        opts = self.options.session
        return run_settings(prepared, m, opts, opts.memory_budget_bytes or self.engine.memory_budget_bytes(), prompt_len)

    def mtp_policy_for(self, m: LoadedModel) -> DepthPolicy:
        """The MTP measurements and "auto"'s verdict for `m`, one for all the requests it answers: a head that does
        not pay is found out once, not probed again by every request (a chat session keeps its own)."""
        if self._mtp_model is not m:
            self._mtp_model, self._mtp_policy = m, DepthPolicy(self.options.session.mtp)
        return self._mtp_policy

    def pool_for(self, m: LoadedModel) -> CheckpointPool:
        if self.pool.owner is not m:
            disk = self.options.disk
            shelf = ModelShelf.of(disk, m, self.options.session.kv) if disk is not None and disk.max_bytes else None
            self.pool.bind(m, shelf)
        if not self._sized:
            budget = self.options.session.memory_budget_bytes or self.engine.memory_budget_bytes()
            size = int((budget - m.weights_bytes) * POOL_SHARE) if budget else FALLBACK_POOL_BYTES
            self.pool.max_bytes = max(MIN_POOL_BYTES, size)
            self._sized = True
        return self.pool

    def sequence(self, job: Job, prepared: PreparedRequest, m: LoadedModel, submitted: float) -> Sequence | None:
        """`prepared` as a sequence of the engine's batch loop, made when the loop takes it (worker): restored from the
        longest checkpoint of its prompt (pool.py), the rest cut at the checkpoint boundaries after it (the loop pauses
        there and the checkpoint is taken: `on_segment`), its answer text through ReplyText. Pictures
        (serving/pictures.py) are laid out in the prompt and keyed by content for the pool, the tower run only on
        those after the checkpoint found; such a request runs alone, on mlx-vlm's positioned model. None when it
        ended already (stopped while it waited)."""
        clock = TurnClock()
        if job.stopped:
            job.emit(cancelled(m, Usage()))
            return None
        prepared = self.current(prepared)
        request, rendered = prepared.request, prepared.rendered
        pictures = self._pictures(m, rendered) if rendered.images else None
        tokens = pictures.tokens if pictures is not None else rendered.tokens
        key = pictures.key if pictures is not None else tuple(tokens)
        boundaries = pictures.boundaries if pictures is not None else rendered.boundaries
        settings = self.settings(m, prepared, len(tokens))
        params, budget, limit = settings.params, settings.budget, settings.limit
        pool = self.pool_for(m)
        cache, source = pool.resume(key, m)
        cached = len(cache)
        usage = Usage(prompt_tokens=len(tokens), cached_tokens=cached)
        job.emit(RequestStarted(usage.prompt_tokens, usage.cached_tokens, source))
        embeddings = self._begin_pictures(pictures, cache, clock) if pictures is not None else None
        text = ReplyText(job, rendered, request)
        clock.reading(len(tokens) - cached)
        job.emit(PromptProgress(0, len(tokens) - cached))
        sampler, processors = make_sampler_and_processors(params)
        reply = SequenceReply(
            m,
            limits=Limits(cached=len(tokens) - 1, limit=limit),
            segment=tokens[-1:],
            params=params,
            thinking=rendered.thinking,
            budget=budget,
            should_stop=text.should_stop,
            emit=text.emit,
            clock=clock,
        )

        def on_segment(end: SegmentEnd) -> None:
            pool.add_saved(end.save())

        def on_done(streamed: StreamedReply | None, _cache: CacheLayers | None, _head: HeadContext | None) -> None:
            self.measured(time.perf_counter() - submitted)
            job.emit(cancelled(m, usage) if streamed is None else completed(m, text, streamed, usage))

        return Sequence(
            job=job,
            prompt=cache,
            segments=_segments(tokens, cached, boundaries),
            sampler=sampler,
            processors=processors,
            reply=reply,
            on_segment=on_segment,
            on_done=on_done,
            # drafts while it is alone (engine/solo.py); a seeded reply never does: MTP's acceptance draws from MLX's
            # global key, so the reply would depend on whether it was alone
            mtp=MTPMode.OFF if request.sampling.seed is not None else self.options.session.mtp,
            kv=kv_quantization(m, self.options.session),  # --kv-bits quantizes it, alone and batched (core/upstream.py)
            mtp_policy=self.mtp_policy_for(m),
            prefill_step=self.options.session.prefill_step_size,
            runs_on=pictures.model if pictures is not None else None,
            embeddings=embeddings,
            keys=list(key) if pictures is not None else None,
            alone=not self.options.batching,
        )

    def _pictures(self, m: LoadedModel, rendered: RenderedPrompt) -> request_pictures.PictureRequest:
        opts = self.options.session
        most = min(opts.context_limit or m.info.max_context, m.info.max_context)
        return request_pictures.prepare(m, rendered.tokens, rendered.boundaries, rendered.images, most, rendered.text)

    @staticmethod
    def _begin_pictures(pictures: request_pictures.PictureRequest, cache: PromptCache, clock: TurnClock) -> mx.array | None:
        """The positioned model set to go on from the cache (restored from a checkpoint with its pictures, or new);
        the tower run on the pictures after it."""
        encoded = request_pictures.begin(pictures, cache)
        clock.image_tokens = encoded.image_tokens if encoded is not None else 0
        return encoded.embeddings if encoded is not None else None


def _segments(tokens: list[int], cached: int, boundaries: tuple[int, ...]) -> list[list[int]]:
    """The prompt after `cached`, cut at each checkpoint boundary after it; the last token alone at the end."""
    cuts = [b for b in boundaries if cached < b < len(tokens) - 1] + [len(tokens) - 1, len(tokens)]
    out, at = [], cached
    for cut in cuts:
        if cut > at:
            out.append(tokens[at:cut])
            at = cut
    return out
