"""Serve completion requests on the engine's worker: one at a time, queued, with prompt checkpoints.

    serving = ServingEngine(engine, ServingOptions(session=SessionOptions(context_limit=32768)))
    job = serving.submit(request)     # a Job (macapp.core.engine); QueueFull beyond the queue limit
    for event in job.events(): ...    # RequestStarted, PromptProgress, ReasoningDelta, AnswerDelta, StatsUpdate,
                                      # ToolCallStarted + ToolCallFinished, then Completed | Failed
    job.stop()                        # a client that went away: Completed(CANCELLED) within about a token

Each request is rendered through the model's chat template (render.py), checked against the context limit
and the memory budget before any work (Failed CONTEXT_LIMIT / MEMORY_BUDGET; INVALID_REQUEST for what the
template or the tool choice refuses), restored from the longest checkpoint of its prompt (pool.py), read
from there with the engine's `prefill` (a checkpoint at each boundary on the way) and answered with the
engine's `stream_reply` (sampling, thinking budget, context cap, statistics). The answer text goes through
the tool-call parser (toolcalls.py) and the stop sequences (stops.py) before it is emitted, so AnswerDelta
never carries tool-call markup nor anything from a stop sequence on; a request for at most one call
(`ToolChoice.parallel` off) ends after the first. max_tokens is clamped to the room the
prompt leaves in the context.

Chat sessions keep their own caches; the pool holds only the API's. Both run on the engine's one worker, so
a chat turn and a request wait for each other.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError, Job, LoadedModel, SessionOptions, TurnClock, prefill, stream_reply, wired_memory
from macapp.core.engine.limits import context_limit, turn_sampling
from macapp.core.events import AnswerDelta, PromptProgress, ReasoningDelta
from macapp.core.serving.pool import CheckpointPool, restore
from macapp.core.serving.render import RenderedPrompt, RenderError, render
from macapp.core.serving.requests import (
    INVALID_REQUEST,
    Completed,
    CompletionRequest,
    FinishReason,
    RequestStarted,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    Usage,
)
from macapp.core.serving.stops import StopMatcher
from macapp.core.serving.toolcalls import ToolCallParser

MIN_POOL_BYTES = 256 * 1024**2
FALLBACK_POOL_BYTES = 2 * 1024**3  # when the memory budget is unknown
POOL_SHARE = 0.25  # of the memory budget the weights leave
FIRST_GUESS_S = 10.0  # a request's duration before one was measured (for Retry-After)


@dataclass(frozen=True)
class ServingOptions:
    session: SessionOptions = field(default_factory=SessionOptions)  # context limit, KV quantization, prefill step, budget
    queue_limit: int = 8  # requests that may wait behind the one running; beyond it submit raises QueueFull
    pool_bytes: int | None = None  # None: POOL_SHARE of the memory budget the weights leave (at least MIN_POOL_BYTES)


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
        self._pending = 0  # submitted, not yet ended (the running one included)
        self._mean_s = FIRST_GUESS_S

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

    def count_tokens(self, request: CompletionRequest) -> int:
        """The prompt's length as the template renders it. Only the tokenizer is read (no MLX): any thread.
        EngineError NO_MODEL or INVALID_REQUEST (what the template or the tool choice refuses), as submit's job would."""
        m = self._model()
        rendered = self._render(m, request)
        if rendered.images:  # each picture's placeholder becomes its image tokens (from the sizes: no tower run)
            from macapp.core.vision.serving import extra_image_tokens

            return len(rendered.tokens) + extra_image_tokens(m.path, rendered.images)
        return len(rendered.tokens)

    def submit(self, request: CompletionRequest) -> Job:
        with self._lock:
            if self._pending > self.options.queue_limit:
                raise QueueFull(self._mean_s * self._pending)
            self._pending += 1
        try:
            job = self.engine.submit("serve", lambda job: self._serve(job, request))
        except BaseException:  # a closed engine
            with self._lock:
                self._pending -= 1
            raise
        job.add_listener(self._on_event)
        return job

    def close(self) -> None:
        """Drop the checkpoints (on the worker, after the requests already submitted)."""

        def work(job: Job) -> None:
            self.pool.clear()
            job.emit(ev.Unloaded(memory_bytes=0))

        try:
            self.engine.submit("serve-close", work)
        except RuntimeError:  # the engine is closed: it dropped everything already
            self.pool.clear()

    def _on_event(self, event: Any) -> None:
        if isinstance(event, ev.TerminalEvent):
            with self._lock:
                self._pending -= 1

    # -- worker ----------------------------------------------------------------------------------------
    def _model(self) -> LoadedModel:
        model = self.engine.model
        if model is None:
            raise EngineError("No model is loaded: load a model first.", ev.NO_MODEL)
        return model

    @staticmethod
    def _render(m: LoadedModel, request: CompletionRequest) -> RenderedPrompt:
        try:
            return render(m.tokenizer, request)
        except RenderError as exc:
            raise EngineError(str(exc), INVALID_REQUEST) from exc

    def _pool_for(self, m: LoadedModel) -> CheckpointPool:
        self.pool.bind(m)
        if not self._sized:
            budget = self.options.session.memory_budget_bytes or self.engine.memory_budget_bytes()
            size = int((budget - m.weights_bytes) * POOL_SHARE) if budget else FALLBACK_POOL_BYTES
            self.pool.max_bytes = max(MIN_POOL_BYTES, size)
            self._sized = True
        return self.pool

    def _serve(self, job: Job, request: CompletionRequest) -> None:
        started = time.perf_counter()
        try:
            self._run(job, request)
        finally:
            with self._lock:
                self._mean_s = 0.7 * self._mean_s + 0.3 * (time.perf_counter() - started)

    def _run(self, job: Job, request: CompletionRequest) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        clock = TurnClock()
        m = self._model()
        if job.stopped:  # the client left while the request waited
            job.emit(_cancelled(m, Usage()))
            return
        rendered = self._render(m, request)
        opts = self.options.session
        # Pictures (macapp.core.vision.serving): laid out in the prompt and keyed by content for the pool; read
        # through mlx-vlm's language model, the tower run only on those after the checkpoint found.
        pictures = self._pictures(m, rendered) if rendered.images else None
        prompt = _Prompt.of(pictures) if pictures else _Prompt(rendered.tokens, tuple(rendered.tokens), rendered.boundaries)
        tokens = prompt.tokens
        run = pictures.model if pictures else m
        budget = request.thinking_budget if rendered.thinking else None
        params = turn_sampling(request.sampling, rendered.thinking, budget, opts)
        limit = context_limit(m, opts, len(tokens), 0, opts.memory_budget_bytes or self.engine.memory_budget_bytes())
        params = replace(params, max_tokens=min(params.max_tokens, limit - len(tokens)))
        pool = self._pool_for(m)
        checkpoint = pool.longest_prefix(prompt.key)
        cached = checkpoint.length if checkpoint is not None else 0
        usage = Usage(prompt_tokens=len(tokens), cached_tokens=cached)
        job.emit(RequestStarted(usage.prompt_tokens, usage.cached_tokens))
        cache = restore(checkpoint) if checkpoint is not None else make_prompt_cache(m.model)
        if pictures is not None:
            prompt = replace(prompt, embeddings=self._begin_pictures(pictures, cache, checkpoint, clock))
        text = _ReplyText(job, rendered, request)
        with wired_memory(m):
            clock.reading(len(tokens) - cached)
            read = self._read(job, run, pool, cache, prompt, cached, pictures)
            if read < len(tokens) - 1:
                job.emit(_cancelled(m, usage))
                return
            streamed = stream_reply(
                run, cache, tokens[-1:], cached=len(tokens) - 1, limit=limit, params=params, thinking=rendered.thinking,
                budget=budget, should_stop=text.should_stop, emit=text.emit, clock=clock, kv=opts.kv,
                prefill_step=opts.prefill_step_size,
            )
        del cache
        mx.clear_cache()
        reply = streamed.reply
        usage.completion_tokens = len(reply.token_ids)
        reason = text.finish(reply.finish_reason)
        job.emit(
            Completed(
                text=text.text, reasoning=reply.reasoning, tool_calls=tuple(text.calls), finish_reason=reason, usage=usage,
                stop_sequence=text.stops.matched, model=m.info.name, ttft_s=reply.stats.ttft_s,
                generation_tps=reply.stats.generation_tps,
            )
        )

    def _pictures(self, m: LoadedModel, rendered: RenderedPrompt):
        from macapp.core.vision import serving as vision_serving

        opts = self.options.session
        most = min(opts.context_limit or m.info.max_context, m.info.max_context)
        return vision_serving.prepare(m, rendered.tokens, rendered.boundaries, rendered.images, most)

    @staticmethod
    def _begin_pictures(pictures, cache: list, checkpoint, clock: TurnClock):
        """The positioned model set to go on from the checkpoint; the tower run on the pictures after it."""
        from macapp.core.vision import serving as vision_serving

        cached, delta = (checkpoint.length, checkpoint.rope_delta) if checkpoint is not None else (0, 0)
        encoded = vision_serving.begin(pictures, cache, cached, delta)
        clock.image_tokens = encoded.image_tokens if encoded is not None else 0
        return encoded.embeddings if encoded is not None else None

    def _read(self, job: Job, m: LoadedModel, pool: CheckpointPool, cache: list, prompt: "_Prompt", cached: int, pictures=None) -> int:
        """Read the prompt from `cached` up to its last token, checkpointing each boundary; return where it got to."""
        tokens = prompt.tokens
        total = len(tokens) - cached
        opts = self.options.session
        pos = cached
        job.emit(PromptProgress(0, total))
        for boundary in [b for b in prompt.boundaries if b > cached]:
            start = pos
            pos += prefill(
                m, cache, tokens[pos:boundary], step=opts.prefill_step_size, kv=opts.kv, should_stop=lambda: job.stopped,
                on_progress=lambda done: job.emit(PromptProgress(start - cached + done, total)),
                embeddings=None if prompt.embeddings is None else prompt.embeddings[pos - cached : boundary - cached],
            )
            if pos < boundary:
                return pos
            pool.add(prompt.key[:boundary], cache, _rope_delta(pictures, boundary))
        return pos


@dataclass(frozen=True)
class _Prompt:
    """What is read: the tokens, their pool key (a picture's tokens are its digest), the checkpoint boundaries, and
    the embeddings of the tokens after the checkpoint when they hold pictures."""

    tokens: list[int]
    key: tuple
    boundaries: tuple[int, ...]
    embeddings: Any = None

    @classmethod
    def of(cls, pictures) -> "_Prompt":
        return cls(pictures.tokens, pictures.key, pictures.boundaries)


def _rope_delta(pictures, index: int) -> int:
    if pictures is None:
        return 0
    from macapp.core.vision import serving as vision_serving

    return vision_serving.rope_delta(pictures, index)


def _cancelled(m: LoadedModel, usage: Usage) -> Completed:
    return Completed(text="", reasoning="", tool_calls=(), finish_reason=FinishReason.CANCELLED, usage=usage, model=m.info.name)


class _ReplyText:
    """Between stream_reply and the job: answer text through the tool-call parser and the stop sequences."""

    def __init__(self, job: Job, rendered: RenderedPrompt, request: CompletionRequest):
        self.job = job
        self.parser = ToolCallParser(rendered.tools) if rendered.tools else None
        if self.parser is not None and rendered.prefill:
            self.parser.feed(rendered.prefill)  # the forced call's opening: the reply goes on inside it
        self.stops = StopMatcher(request.stop)
        self.single_call = not request.tool_choice.parallel
        self.pieces: list[str] = []
        self.calls: list[ToolCall] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def should_stop(self) -> bool:
        return self.stops.matched is not None or self.job.stopped or (self.single_call and bool(self.calls))

    def emit(self, event: Any) -> None:
        if isinstance(event, AnswerDelta):
            self._pieces(self.parser.feed(event.text) if self.parser is not None else [event.text])
        elif isinstance(event, ReasoningDelta) and self.stops.matched is not None:
            return
        else:
            self.job.emit(event)

    def finish(self, engine_finish: str) -> FinishReason:
        """Release what was held back; the request's finish reason from the engine's."""
        if self.parser is not None:
            self._pieces(self.parser.flush(complete=engine_finish == "stop"))
        self._say(self.stops.flush())
        if self.stops.matched is not None:
            return FinishReason.STOP_SEQUENCE
        if engine_finish == "stopped" and not (self.single_call and self.calls):
            return FinishReason.CANCELLED
        if engine_finish in ("length", "context"):
            return FinishReason.LENGTH
        return FinishReason.TOOL_CALLS if self.calls else FinishReason.STOP

    def _pieces(self, pieces: list) -> None:
        for piece in pieces:
            if self.stops.matched is not None:
                return
            if isinstance(piece, ToolCall):
                if self.single_call and self.calls:
                    return  # one call was asked for: the others in its block, and anything after, are not the reply
                self._say(self.stops.flush())  # held text was no stop sequence: the text ended at the call
                index = len(self.calls)
                self.calls.append(piece)
                self.job.emit(ToolCallStarted(index, piece.id, piece.name))
                self.job.emit(ToolCallFinished(index, piece))
            else:
                self._say(self.stops.feed(piece))

    def _say(self, text: str) -> None:
        if text:
            self.pieces.append(text)
            self.job.emit(AnswerDelta(text))

