"""A conversation with one prompt cache, appended to turn by turn (the engine package docstring has the design)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from macapp.core import events as ev
from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import limits, turns
from macapp.core.engine.reply import Limits, SequenceReply
from macapp.core.engine.clock import TurnClock
from macapp.core.engine.errors import EngineError
from macapp.core.engine.jobs import Job
from macapp.core.engine.messages import ChatMessage
from macapp.core.engine.model_folder import LoadedModel
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import SessionOptions
from macapp.core.engine.sequence import SegmentEnd, Sequence as BatchedSequence
from macapp.core.engine.reply import StreamedReply
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

Turn = Callable[[Job], BatchedSequence | None]  # a turn's work, when the batch loop takes it: the Sequence it reads


class SessionHost(Protocol):
    """What a session needs of its engine (engine.Engine): the loaded model, jobs on the one MLX thread, the batch."""

    @property
    def model(self) -> LoadedModel | None: ...

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job: ...

    def new_job(self, kind: str) -> Job: ...

    def batch_loop(self) -> "BatchLoop": ...

    def memory_budget_bytes(self) -> int | None: ...

    position_shelf: ShelfFactory | None  # chat sessions' positions on disk (shelf.py), when a front end set one


@dataclass
class _Read:
    before_last: SavedPosition | None = None  # a mark just before the prompt's last token
    saved: SavedPosition | None = None  # a detached position there (with a shelf, or from the batch's copy), with the
    # MTP head's context there where the prompt was read with it
    undone: bool = False  # a stop while reading already answered the turn (Job.stop's early Finished)
    failed: bool = False  # an error ended it (its Failed is out)


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
        return self._submit_turn(lambda job: self._send(job, text, bool(thinking), sampling, thinking_budget, images))

    def regenerate(self, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last reply with a new one to the same message; `thinking` None keeps the last mode."""
        return self._submit_turn(lambda job: self._redo(job, None, thinking, sampling, thinking_budget))

    def edit_last(self, text: str, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last user message (and its reply) with `text`, and answer it."""
        return self._submit_turn(lambda job: self._redo(job, text, thinking, sampling, thinking_budget))

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

    def _submit_turn(self, turn: Turn) -> Job:
        """A turn as one sequence of the engine's batch loop (alone, or beside the API's requests: the chat neither
        waits for the agents' replies nor makes them wait): `turn(job)` runs when the loop takes it and returns the
        Sequence to read."""
        job = self.engine.new_job("chat")
        self.last_job = job
        self.engine.batch_loop().add(job, lambda _m: self._start_turn(job, turn))
        return job

    def _start_turn(self, job: Job, turn: Turn) -> BatchedSequence | None:
        try:
            return turn(job)
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
        return self._run_turn(job, m, clock, plan, sampling, budget)

    def _redo(
        self,
        job: Job,
        new_text: str | None,
        thinking: bool | None,
        sampling: SamplingParams | None,
        budget: int | None,
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
        return self._run_turn(job, m, clock, plan, sampling, budget)

    # -- the turn (worker thread) ----------------------------------------------------------------------
    def _run_turn(
        self,
        job: Job,
        m: LoadedModel,
        clock: TurnClock,
        plan: TurnPlan,
        sampling: SamplingParams | None,
        budget: int | None,
    ) -> BatchedSequence:
        """The turn's sequence (turn_sequence), its pictures encoded and its limits known."""
        params = limits.turn_sampling(sampling, plan.mode.thinking, budget, self.options)
        if plan.rereads:  # the conversation is read again: from the shelf's longest position of it, if any
            self.forget_cache()
            self._model = m
        plan = self._warm_start(m, plan)
        cached = plan.restore.length if plan.restore is not None else len(self.tokens)
        budget_bytes = self.options.memory_budget_bytes or self.engine.memory_budget_bytes()
        encoded = self._encode_pictures(m, plan, cached, clock) if plan.images else None
        if encoded is not None:
            plan = dataclasses.replace(plan, prompt=encoded.tokens)
        with_tower = dataclasses.replace(m, weights_bytes=m.weights_bytes + engine_pictures.attached_bytes(m))
        limit = limits.context_limit(with_tower, self.options, len(plan.prompt), cached, budget_bytes)  # the tower counts
        return self.turn_sequence(job, m, clock, plan, params, budget, limit, encoded)

    def turn_sequence(
        self,
        job: Job,
        m: "LoadedModel",
        clock: TurnClock,
        plan: TurnPlan,
        params: SamplingParams,
        budget: int | None,
        limit: int,
        encoded: EncodedTurn | None = None,
    ) -> BatchedSequence:
        """The turn as one sequence of the engine's batch loop (worker thread, when the loop takes it).

        Alone (solo.py) the sequence reads into the session's own cache; in mlx-lm's batch into a copy that comes back
        in `on_done` (mlx-lm's `extract`, the price of sharing the batch). A stop while reading undoes the turn (the
        cache rewound to the turn's start). The position before the prompt's last token is regenerate's mark; with a
        disk shelf the position at the reply's turn start (its last <|im_start|>) is kept there too, so a reopened
        conversation's prompt starts the same. A turn that drafted with the MTP head hands its head's context back,
        so the conversation's goes on. Pictures (`encoded`) are read by mlx-vlm's positioned model, alone."""
        previous = self._turn
        turn_start = self._rewind(m, plan)
        self._messages = list(plan.history)
        runs_on = self._with_pictures(m, encoded) if encoded is not None or self._live.spans else None
        head, last = plan.prompt[:-1], plan.prompt[-1:]
        start = len(self._live)
        clock.reading(len(plan.prompt))
        job.emit(PromptProgress(0, len(plan.prompt)))
        stopped = Finished(Reply(thinking=plan.mode.thinking, finish_reason="stopped", kept=False, stats=clock.unanswered(turn_start.length)))
        read = _Read()
        if head and plan.undo_on_stop:
            job.arm_early_reply(stopped)

        def on_segment(end: SegmentEnd) -> None:
            if end.length < start + len(head):  # the reply's turn start: for the shelf
                self._shelve(end.save())
                return
            read.before_last = end.mark()
            if self._shelf_for(m) is not None:
                read.saved = end.save()  # a reopened conversation's prompt starts the same (shelved at the end)
            read.undone = plan.undo_on_stop and job.disarm_early_reply()

        def on_failed() -> None:
            read.failed = True

        def on_done(streamed: StreamedReply | None, cache: CacheLayers | None, context: HeadContext | None) -> None:
            if read.failed:  # the cache is in an unknown state: the next send re-reads the conversation
                self.forget_cache()
                self._model = m
                self._messages.append(self._user_message(plan))
                return
            if streamed is None or read.undone or cache is None:
                self._undo(m, plan, turn_start, previous)
                stopped.reply.stats.elapsed_s = clock.elapsed()
                job.emit(stopped)  # ignored if stop() already sent it
                return
            prompt = self._live
            if head:
                if read.before_last is None:
                    raise RuntimeError("the batch finished a two-segment prompt without reporting its first segment")
                before_last = read.before_last
                if read.saved is not None:
                    self._shelve(read.saved)
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
            if context is not None and read.saved is not None:
                context.keep_mark(read.saved)  # regenerate's rewind to before_last goes on pairing
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
        cut = self._cut(head, runs_on)
        return BatchedSequence(
            job=job,
            prompt=self._live,
            segments=[s for s in (head[:cut], head[cut:], last) if s],
            sampler=sampler,
            processors=processors,
            reply=reply,
            on_segment=on_segment,
            on_done=on_done,
            on_failed=on_failed,
            keep_cache=True,
            mtp=self.options.mtp,
            kv=limits.kv_quantization(m, self.options),  # unlike the batch's: it runs alone (batch.py)
            mtp_policy=self.mtp_policy,
            prefill_step=self.options.prefill_step_size,
            runs_on=runs_on,
            embeddings=None if encoded is None else encoded.embeddings,
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
        (turns.replay), so the position that session left after its last reply matches (or, for a Regenerate or Edit,
        the one before its last reply or at its last turn's start). Its prefix is then counted
        from there (an edit goes back to the turn's start), or None when the position is past it (an edit reads it
        all)."""
        if self._prompt is not None or plan.restore is not None or plan.images:
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

    def _cut(self, head: list[int], runs_on: LoadedModel | None) -> int:
        """Where the prompt's reading pauses before its last token: with a shelf, at the reply's turn start (its last
        <|im_start|>), so the position there is kept (0: no pause; a turn with pictures reads in one go)."""
        m = self._model
        if runs_on is not None or m is None or self._shelf_for(m) is None:
            return 0
        start_id = m.tokenizer.convert_tokens_to_ids("<|im_start|>")
        return max((i for i, t in enumerate(head) if t == start_id), default=0)

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
