"""A conversation with one prompt cache, appended to turn by turn (the engine package docstring has the design)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from macapp.core import events as ev
from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import limits, turns
from macapp.core.engine.batch_reply import Limits, SequenceReply
from macapp.core.engine.clock import TurnClock
from macapp.core.engine.errors import EngineError
from macapp.core.engine.jobs import Job
from macapp.core.engine.messages import ChatMessage
from macapp.core.engine.model_folder import LoadedModel
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import SessionOptions
from macapp.core.engine.prefill import prefill, wired_memory
from macapp.core.engine.sequence import Sequence as BatchedSequence
from macapp.core.engine.reply import StreamedReply, head_context, pick_policy, stream_reply
from macapp.core.engine.shelf import PositionShelf, ShelfFactory
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.engine.positions import SavedPosition
from macapp.core.engine.turns import ThinkingMode, TurnMemory, TurnPlan
from macapp.core.events import Finished, PromptProgress, Reply
from macapp.core.sampling import SamplingParams, make_sampler_and_processors
from macapp.core.engine import pictures as engine_pictures
from macapp.core.engine.pictures import Picture

if TYPE_CHECKING:
    from macapp.core.engine.batch import BatchLoop
    from macapp.core.vision.runner import EncodedTurn


log = logging.getLogger(__name__)

Turn = Callable[[Job, bool], BatchedSequence | None]  # a turn's work: batched, it returns the Sequence the batch reads


class SessionHost(Protocol):
    """What a session needs of its engine (engine.Engine): the loaded model, jobs on the one MLX thread, the batch."""

    @property
    def model(self) -> LoadedModel | None: ...

    @property
    def serving(self) -> bool: ...

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job: ...

    def new_job(self, kind: str) -> Job: ...

    def batch_loop(self) -> "BatchLoop | None": ...

    def memory_budget_bytes(self) -> int | None: ...

    position_shelf: ShelfFactory | None  # chat sessions' positions on disk (shelf.py), when a front end set one


@dataclass
class _Read:
    before_last: SavedPosition | None = None  # just before the prompt's last token (from the batch), with the MTP
    # head's context there where the prompt was read with it
    undone: bool = False  # a stop while reading already answered the turn (Job.stop's early Finished)


class ChatSession:
    """One conversation with one prompt cache, appended to turn by turn. Methods return Jobs."""

    def __init__(self, engine: SessionHost, system_prompt: str | None, messages: list[ChatMessage] | None, options: SessionOptions):
        self.engine = engine
        self.options = options
        self.system_prompt = system_prompt
        initial = [dict(m) for m in (messages or [])]
        if initial and initial[0].get("role") == "system":
            if system_prompt is None:
                self.system_prompt = initial[0].get("content") or None
            initial = initial[1:]
        self._messages: list[ChatMessage] = initial
        self._model: LoadedModel | None = None  # the model the cache belongs to
        self._prompt: PromptCache | None = None  # the cache, its tokens and the pictures among them (None until a turn)
        self._close_text = ""  # what the next turn feeds first to close the previous reply
        self._turn: TurnMemory | None = None
        self.last_job: Job | None = None
        self.last_reply: Reply | None = None
        self.mtp_policy = DepthPolicy(options.mtp)  # the MTP head's measurements and "auto"'s verdict for this conversation
        self._shelf: tuple[LoadedModel, PositionShelf | None] | None = None  # the engine's disk shelf for the model

    # -- public ----------------------------------------------------------------------------------------
    @property
    def messages(self) -> list[ChatMessage]:
        """The conversation: role/content dicts; assistant ones also carry reasoning, thinking and finish_reason."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return out + [dict(m) for m in self._messages]

    @property
    def context_tokens(self) -> int:
        """Tokens in this session's cache (0 until the first send of a reopened conversation)."""
        return len(self.tokens)

    @property
    def tokens(self) -> list[int]:
        """Every token in the cache, in order ([] without one)."""
        return self._prompt.tokens if self._prompt is not None else []

    @property
    def cache(self) -> CacheLayers | None:
        """The prompt cache (mlx-lm layers, holding `tokens`), None until a turn makes one; read it only on the worker."""
        return self._prompt.layers if self._prompt is not None else None

    @property
    def snapshot_bytes(self) -> int:
        """Memory the regenerate/edit snapshots keep alive (DeltaNet states of two earlier points)."""
        turn = self._turn
        return 0 if turn is None else turn.before_turn.state_bytes + turn.before_last.state_bytes

    def send(
        self,
        text: str,
        thinking: bool = True,
        sampling: SamplingParams | None = None,
        thinking_budget: int | None = None,
        images: Sequence[Picture] | None = None,
    ) -> Job:
        """Add a user message and stream the reply. `sampling` None: the model card's preset for the mode. `images`:
        pictures for this message (paths, encoded bytes or vision.images.PreparedImage), run through mlx-vlm."""
        return self._submit_turn(lambda job, batched: self._send(job, text, bool(thinking), sampling, thinking_budget, images, batched), images)

    def regenerate(self, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last reply with a new one to the same message; `thinking` None keeps the last mode."""
        return self._submit_turn(lambda job, batched: self._redo(job, None, thinking, sampling, thinking_budget, batched))

    def edit_last(self, text: str, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last user message (and its reply) with `text`, and answer it."""
        return self._submit_turn(lambda job, batched: self._redo(job, text, thinking, sampling, thinking_budget, batched))

    def reset(self) -> Job:
        """Forget the cache (not the messages): the next send reads the conversation once through the template."""

        def work(job: Job) -> None:
            self.forget_cache()
            job.emit(Finished(Reply(kept=False)))

        return self._submit(work)

    def forget_cache(self) -> None:
        """Drop the cache (worker thread: the engine calls it when the model goes; elsewhere use reset())."""
        self._prompt = None
        self._model = None
        self._close_text = ""
        self._turn = None

    @property
    def _live(self) -> PromptCache:
        """The cache a turn runs on, made by `_rewind` at the turn's start."""
        if self._prompt is None:
            raise RuntimeError("this session has no prompt cache: a turn makes one (_rewind) before using it")
        return self._prompt

    # -- planning (worker thread) ----------------------------------------------------------------------
    def _submit(self, work: Callable[[Job], None]) -> Job:
        job = self.engine.submit("chat", work)
        self.last_job = job
        return job

    def _submit_turn(self, turn: Turn, images: Sequence[Picture] | None = None) -> Job:
        """A turn as a job of its own, or, while the local API serves from this engine, as one more sequence of its
        batch (so the chat neither waits for the agents' replies nor makes them wait): `turn(job, batched)` then runs
        when the batch takes it and returns the Sequence to insert."""
        batch = self.engine.batch_loop() if self._joins_batch(images) else None
        if batch is None:

            def alone(job: Job) -> None:
                turn(job, False)  # a job of its own: the turn returns nothing

            return self._submit(alone)
        job = self.engine.new_job("chat")
        self.last_job = job
        batch.add(job, lambda _m: self._in_batch(job, turn))
        return job

    def _joins_batch(self, images: Sequence[Picture] | None) -> bool:
        """Text turns join the API's batch when their KV quantization is the batch's (one kind per batch: mlx-lm
        merges the caches); pictures (mlx-vlm's model, mRoPE positions) run as jobs of their own."""
        if not self.engine.serving or images or engine_pictures.pictures_in(self._messages):
            return False
        batch, m = self.engine.batch_loop(), self.engine.model
        return batch is not None and m is not None and limits.kv_quantization(m, self.options) == batch.kv

    def _in_batch(self, job: Job, turn: Turn) -> BatchedSequence | None:
        try:
            return turn(job, True)
        except EngineError:
            raise
        except Exception:
            self.forget_cache()  # the cache is in an unknown state: the next send re-reads the conversation
            raise

    def _require_model(self) -> LoadedModel:
        model = self.engine.model
        if model is None:
            raise EngineError("No model is loaded: load a model first.", ev.NO_MODEL)
        if self._model is not model:  # another model: its cache starts empty and reads the conversation once
            self.forget_cache()
            self._model = model
        return model

    def _send(
        self,
        job: Job,
        text: str,
        thinking: bool,
        sampling: SamplingParams | None,
        budget: int | None,
        images: Sequence[Picture] | None = None,
        batched: bool = False,
    ) -> BatchedSequence | None:
        clock = TurnClock()
        if job.stopped:
            job.emit(Finished(Reply(thinking=thinking, finish_reason="stopped", kept=False)))
            return None
        turns.require_text(text)
        m = self._require_model()
        pictures = engine_pictures.open_pictures(images)
        if pictures:
            engine_pictures.vision_for(m)  # a text-only build refuses here, before anything changes
        appending = self._prompt is not None and bool(self.tokens)
        plan = turns.plan_send(
            m.tokenizer,
            text=text,
            mode=ThinkingMode.of(thinking, budget),
            messages=self._messages,
            system_prompt=self.system_prompt,
            close_text=self._close_text if appending else None,
            images=pictures,
        )
        return self._run_turn(job, m, clock, plan, sampling, budget, batched)

    def _redo(
        self,
        job: Job,
        new_text: str | None,
        thinking: bool | None,
        sampling: SamplingParams | None,
        budget: int | None,
        batched: bool = False,
    ) -> BatchedSequence | None:
        clock = TurnClock()
        if job.stopped:
            job.emit(Finished(Reply(finish_reason="stopped", kept=False)))
            return None
        last_user = turns.last_user_index(self._messages, new_text)
        m = self._require_model()
        plan = turns.plan_redo(
            m.tokenizer,
            new_text=new_text,
            thinking=thinking,
            budget=budget,
            messages=self._messages,
            last_user=last_user,
            system_prompt=self.system_prompt,
            last=self._turn if self._prompt is not None else None,
        )
        return self._run_turn(job, m, clock, plan, sampling, budget, batched)

    # -- the turn (worker thread) ----------------------------------------------------------------------
    def _run_turn(
        self,
        job: Job,
        m: LoadedModel,
        clock: TurnClock,
        plan: TurnPlan,
        sampling: SamplingParams | None,
        budget: int | None,
        batched: bool = False,
    ) -> BatchedSequence | None:
        """Run the turn (batched: return the Sequence the batch reads and answers it with: batched_sequence)."""
        params = limits.turn_sampling(sampling, plan.mode.thinking, budget, self.options)
        plan = self._warm_start(m, plan)
        if plan.restore is not None:
            cached = plan.restore.length
        else:
            cached = 0 if plan.rereads else len(self.tokens)
        budget_bytes = self.options.memory_budget_bytes or self.engine.memory_budget_bytes()
        encoded = self._encode_pictures(m, plan, cached, clock) if plan.images else None
        if encoded is not None:
            plan = dataclasses.replace(plan, prompt=encoded.tokens)
        with_tower = dataclasses.replace(m, weights_bytes=m.weights_bytes + engine_pictures.attached_bytes(m))
        limit = limits.context_limit(with_tower, self.options, len(plan.prompt), cached, budget_bytes)  # the tower counts
        if batched:
            return self.batched_sequence(job, m, clock, plan, params, budget, limit)
        try:
            reply = self._read_and_stream(job, m, clock, plan, params, budget, limit, encoded)
        except Exception:
            self.forget_cache()  # the cache is in an unknown state: the next send re-reads the conversation
            self._model = m
            raise
        if reply is not None:
            job.emit(Finished(reply))
        return None

    def batched_sequence(
        self,
        job: Job,
        m: "LoadedModel",
        clock: TurnClock,
        plan: TurnPlan,
        params: SamplingParams,
        budget: int | None,
        limit: int,
    ) -> BatchedSequence:
        """The turn as one sequence of the engine's batch (worker thread, when the batch takes it).

        The batch reads and writes copies of the caches it is given, so nothing of the session changes until the turn
        is over: a stop while reading undoes the turn by changing nothing but the plan's rewind, and the reply's cache
        comes back in `on_done`. Two points come from the batch: the position before the prompt's last token
        (regenerate's mark, from the segment's end) and the cache after the reply, each a copy of the KV cache
        (mlx-lm's `extract`), the price of sharing the batch. A turn that ran alone (solo.py) with the MTP head hands
        its head's context back too, so the conversation's goes on."""
        if plan.rereads:
            self.forget_cache()
            self._model = m
        previous = self._turn
        turn_start = self._rewind(m, plan)
        self._messages = list(plan.history)
        head, last = plan.prompt[:-1], plan.prompt[-1:]
        clock.reading(len(plan.prompt))
        job.emit(PromptProgress(0, len(plan.prompt)))
        stopped = Finished(Reply(thinking=plan.mode.thinking, finish_reason="stopped", kept=False, stats=clock.unanswered(turn_start.length)))
        read = _Read()
        if head and plan.undo_on_stop:
            job.arm_early_reply(stopped)

        def on_segment(position: SavedPosition) -> None:
            read.before_last = position
            read.undone = plan.undo_on_stop and job.disarm_early_reply()

        def on_done(streamed: StreamedReply | None, cache: CacheLayers | None, context: HeadContext | None) -> None:
            if streamed is None or read.undone or cache is None:
                self._undo(m, plan, turn_start, previous)
                stopped.reply.stats.elapsed_s = clock.elapsed()
                job.emit(stopped)  # ignored if stop() already sent it
                return
            prompt = self._live
            if head:
                if read.before_last is None:
                    raise RuntimeError("the batch finished a two-segment prompt without reporting its first segment")
                before_last = read.before_last.as_mark()  # its KV buffers are the batch's copy: lengths do
                self._shelve(read.before_last)  # detached: a reopened conversation's prompt starts the same
            else:
                before_last = prompt.mark()
            self._turn = TurnMemory(
                before_turn=turn_start,
                close_before=plan.close_before,
                prefix=plan.prefix,
                before_last=before_last,
                last_token=last[0],
                mode=plan.mode,
            )
            self._messages.append(self._user_message(plan))
            prompt.adopt(cache, head, context)
            if context is not None and read.before_last is not None:
                context.keep_mark(read.before_last)  # regenerate's rewind to before_last goes on pairing
            self._settle_reply(m, plan, streamed)
            job.emit(Finished(streamed.reply))

        sampler, processors = make_sampler_and_processors(params)
        reply = SequenceReply(
            m,
            limits=Limits(cached=len(self.tokens) + len(head), limit=limit),
            segment=last,
            params=params,
            thinking=plan.mode.thinking,
            budget=budget,
            should_stop=job.stop_event.is_set,
            emit=job.emit,
            clock=clock,
        )
        return BatchedSequence(
            job=job,
            prompt=self._live,
            segments=[s for s in (head, last) if s],
            sampler=sampler,
            processors=processors,
            reply=reply,
            on_segment=on_segment,
            on_done=on_done,
            keep_cache=True,
            mtp=self.options.mtp,
            kv=limits.kv_quantization(m, self.options),  # the batch's (ChatSession joins only then)
            mtp_policy=self.mtp_policy,
        )

    def _shelf_for(self, m: LoadedModel) -> PositionShelf | None:
        factory = self.engine.position_shelf
        if factory is None:
            return None
        if self._shelf is None or self._shelf[0] is not m:
            self._shelf = (m, factory(m, self.options.kv))
        return self._shelf[1]

    def _warm_start(self, m: LoadedModel, plan: TurnPlan) -> TurnPlan:
        """A conversation without a cache yet (reopened, after a restart too) starts from the longest position of its
        prompt on the engine's shelf (the disk), and reads only the rest: its prompt is the tokens its session held
        (turns.replay), so the position that session left after its last reply matches. Its prefix is then counted
        from there (an edit goes back to the turn's start), or None when the position is past it (an edit reads it
        all)."""
        if self._prompt is not None or plan.rereads or plan.restore is not None or plan.images:
            return plan
        shelf = self._shelf_for(m)
        found = shelf.lookup(plan.prompt) if shelf is not None else None
        if found is None or found.spans:
            return plan
        self._prompt = PromptCache.restore(found)
        n = found.length
        log.info("prompt cache: a conversation without a cache reuses %d of its %d prompt tokens from disk", n, len(plan.prompt))
        prefix = plan.prefix[n:] if plan.prefix is not None and n <= len(plan.prefix) else None
        return dataclasses.replace(plan, prompt=plan.prompt[n:], prefix=prefix)

    def _shelve(self, position: SavedPosition | None = None) -> None:
        """Keep a detached position of this conversation on the shelf: `position`, or the cache as it is (text only:
        pictures are the API's to key)."""
        shelf = self._shelf_for(self._model) if self._model is not None else None
        if shelf is None or self._prompt is None or self._prompt.spans:
            return
        if position is None:
            try:
                position = self._prompt.save()
            except (ValueError, TypeError):  # a cache that cannot be saved as it is (a KV layer ahead of its tokens)
                return
        if not position.spans:
            shelf.put(position)

    def _encode_pictures(self, m: LoadedModel, plan: TurnPlan, cached: int, clock: TurnClock) -> EncodedTurn:
        """The plan's prompt with its pictures encoded by the tower (once, here: its time is in the TTFT), after
        checking they fit the context (vision.runner.EncodedTurn)."""
        vision = engine_pictures.vision_for(m)
        most = min(self.options.context_limit or m.info.max_context, m.info.max_context)
        engine_pictures.check_room(vision, plan.images, cached + len(plan.prompt), most - 1)
        encoded: EncodedTurn = vision.encode(plan.prompt, plan.images)
        clock.image_tokens = encoded.image_tokens
        return encoded

    def _read_and_stream(
        self,
        job: Job,
        m: LoadedModel,
        clock: TurnClock,
        plan: TurnPlan,
        params: SamplingParams,
        budget: int | None,
        limit: int,
        encoded: EncodedTurn | None = None,
    ) -> Reply | None:
        """Read the plan's prompt and stream the reply; None when a stop while reading undid the turn."""
        if plan.rereads:
            self.forget_cache()
            self._model = m
        previous = self._turn
        turn_start = self._rewind(m, plan)
        if encoded is not None or self._live.spans:
            m = self._with_pictures(m, encoded)
        self._messages = list(plan.history)
        clock.reading(len(plan.prompt))
        context = head_context(m, self._live, pick_policy(m, self._live.layers, limits.kv_quantization(m, self.options), self.options.mtp, self.mtp_policy))
        with wired_memory(m):
            if not self._read_prompt(job, m, clock, plan, turn_start, previous, encoded, context):
                return None
            self._shelve()  # before the reply: a reopened conversation's prompt starts the same
            self._turn = TurnMemory(
                before_turn=turn_start,
                close_before=plan.close_before,
                prefix=plan.prefix,
                before_last=self._live.mark(),
                last_token=plan.prompt[-1],
                mode=plan.mode,
            )
            self._messages.append(self._user_message(plan))
            streamed = stream_reply(
                m,
                self._live.layers,
                plan.prompt[-1:],
                cached=len(self.tokens),
                limit=limit,
                params=params,
                thinking=plan.mode.thinking,
                budget=budget,
                should_stop=job.stop_event.is_set,
                emit=job.emit,
                clock=clock,
                kv=limits.kv_quantization(m, self.options),
                prefill_step=self.options.prefill_step_size,
                mtp=self.options.mtp,
                mtp_policy=self.mtp_policy,
                mtp_context=context,
            )
        self._settle_reply(m, plan, streamed)
        return streamed.reply

    def _rewind(self, m: LoadedModel, plan: TurnPlan) -> SavedPosition:
        """Make sure there is a cache and go back to the plan's point in it; return where the turn starts."""
        if self._prompt is None:
            self._prompt = PromptCache.new(m)
        if plan.restore is not None:
            self._prompt.rewind(plan.restore)
        return plan.turn_start or self._prompt.mark()

    def _with_pictures(self, m: LoadedModel, encoded: EncodedTurn | None) -> LoadedModel:
        """The model as this session's turns with pictures run it: mlx-vlm's language model with explicit mRoPE
        positions (sharing the loaded weights), on this session's cache and its picture spans."""
        vision = engine_pictures.vision_for(m)
        vision.lm.bind(self._live.spans)
        if encoded is not None:
            vision.lm.queue(encoded, self._live.layers)
        return dataclasses.replace(m, model=vision.lm)

    @staticmethod
    def _user_message(plan: TurnPlan) -> ChatMessage:
        message: ChatMessage = {"role": "user", "content": plan.user_text}
        if plan.user_images:
            message["images"] = list(plan.user_images)
        return message

    def _read_prompt(
        self,
        job: Job,
        m: LoadedModel,
        clock: TurnClock,
        plan: TurnPlan,
        turn_start: SavedPosition,
        previous: TurnMemory | None,
        encoded: EncodedTurn | None = None,
        context: HeadContext | None = None,
    ) -> bool:
        """Prefill all but the prompt's last token (`context`: the MTP head's, fed as it goes); False if a stop undid
        the turn (its Finished is then emitted).

        A stop during a chunk is answered at once by Job.stop() (armed here); the undo waits for the chunk."""
        prompt = plan.prompt
        total = len(prompt)
        job.emit(PromptProgress(0, total))
        stopped = Finished(Reply(thinking=plan.mode.thinking, finish_reason="stopped", kept=False, stats=clock.unanswered(turn_start.length)))
        if plan.undo_on_stop:
            job.arm_early_reply(stopped)
        held = len(self._live)
        done = 0

        def progress(at: int) -> Callable[[int], None]:
            return lambda n: job.emit(PromptProgress(at + n, total))

        for end in self._cuts(prompt, encoded):
            start = done
            done += prefill(
                m,
                self._live.layers,
                prompt[start:end],
                step=self.options.prefill_step_size,
                kv=limits.kv_quantization(m, self.options),
                should_stop=job.stop_event.is_set if plan.undo_on_stop else None,
                on_progress=progress(start),
                embeddings=None if encoded is None else encoded.embeddings,
                head=context,
                held=held + start,
            )
            self._live.extend(prompt[start:done])
            if done < end:
                break
            if end < total - 1:
                self._shelve()  # before the reply's turn: where a reopened conversation's prompt parts from this one
        if plan.undo_on_stop and (job.disarm_early_reply() or job.stopped):
            self._undo(m, plan, turn_start, previous)
            stopped.reply.stats.elapsed_s = clock.elapsed()
            job.emit(stopped)  # ignored if stop() already sent it
            return False
        return True

    def _cuts(self, prompt: list[int], encoded: EncodedTurn | None) -> list[int]:
        """Where the prompt's reading stops (all but its last token): with a shelf, first at the reply's turn start
        (its last <|im_start|>), so the position there is kept (text only: a turn with pictures reads in one go)."""
        last = len(prompt) - 1
        m = self._model
        if encoded is not None or self._live.spans or m is None or self._shelf_for(m) is None:
            return [last]
        start_id = m.tokenizer.convert_tokens_to_ids("<|im_start|>")
        cut = max((i for i, t in enumerate(prompt[:last]) if t == start_id), default=0)
        return [cut, last] if cut > 0 else [last]

    def _undo(self, m: LoadedModel, plan: TurnPlan, turn_start: SavedPosition, previous: TurnMemory | None) -> None:
        """A stop while reading: the conversation and the cache as before the turn."""
        self._live.rewind(turn_start)
        self._close_text = plan.close_before
        self._turn = previous if plan.restore is None else None
        if plan.keeps_message_on_undo:  # not read yet: the next send reads it all, this message included
            self.forget_cache()
            self._model = m
            self._messages.append(self._user_message(plan))

    def _settle_reply(self, m: LoadedModel, plan: TurnPlan, streamed: StreamedReply) -> None:
        """The reply is in the cache: account for its tokens, and know how the next turn closes it."""
        reply = streamed.reply
        self._live.extend(streamed.tokens_added)
        self._close_text = turns.close_text(self.tokens[-1] if self.tokens else None, m.im_end_id, streamed.still_reasoning)
        reply.cache_tokens = turns.held_tokens(m.tokenizer, plan.mode, streamed.tokens_added)  # a reopening reads them again
        self._messages.append(
            {
                "role": "assistant",
                "content": reply.text,
                "reasoning": reply.reasoning,
                "thinking": plan.mode.thinking,
                "finish_reason": reply.finish_reason,
                "cache_tokens": reply.cache_tokens,
            }
        )
        self.last_reply = reply
        self._shelve()
