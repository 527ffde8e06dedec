"""Continuous batching: many sequences decoding together on the worker, through mlx-lm's BatchGenerator.

    loop = BatchLoop(engine, limit=8)
    loop.add(starter)      # any thread: `starter(model)` runs on the worker when the batch takes it and returns
                           # the Sequence to insert (or None: it ended already, e.g. stopped while waiting)

Sequences join and leave the running batch at token boundaries: the loop inserts what arrived since the last
step, calls the generator's `next()` once (one decode step for the batch and one prefill chunk for those still
reading), and hands each sequence its token (`SequenceReply.take`). Each keeps its own sampler, logits
processors, max tokens, thinking budget, stop and cancellation; prompts are inserted in segments so the
generator pauses at their boundaries and the caller can checkpoint there (`Sequence.on_segment`). A sequence
that arrives at an empty batch runs alone, outside the generator, until another arrives (solo.py says why); one
left alone mid-reply when the others end goes back to running alone.

What BatchGenerator lacks and this adds (a wrapper, not a second batching engine): the thinking budget, which
must feed tokens the model did not sample (the sequence is taken out with its cache and inserted again with the
closing tag to read, as stream_reply feeds it); a stop asked from another thread; and fair turns with the rest
of the worker's jobs: while any other job waits for the worker (a chat turn, a load, a request that cannot be
batched), the loop takes no new sequence, lets the ones it has finish and hands the worker over; sequences that
arrived meanwhile wait for the next loop, queued behind that job.

The loop is a Job of kind "batch" on the engine's worker (one at a time per BatchLoop). Its sequences have Jobs
of their own, which the caller made and owns.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, cast

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.batch_reply import Next, SequenceReply
from macapp.core.engine.jobs import Job
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy, MTPCounts
from macapp.core.engine.options import MTPMode
from macapp.core.engine.positions import SavedPosition, save
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.engine.reply import StreamedReply
from macapp.core.engine.solo import Ended, HandOver, SoloRun
from macapp.core.engine.worker import waiting_jobs
from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.events import Failed, Finished, PromptProgress, Reply

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

    from macapp.core.engine.engine import Engine
    from macapp.core.engine.model_folder import LoadedModel

log = logging.getLogger(__name__)

PREFILL_BATCH = 8  # prompts read together (mlx-lm's server default)
DEFAULT_LIMIT = 32  # sequences decoding together (mlx-lm's server default)


@dataclass(eq=False)
class Sequence:
    """One sequence for the batch: its cache and what it reads into it, how it samples, and who hears of it.

    `segments`: the prompt tokens to read after what `prompt` holds, split where the caller wants to hear of a
    boundary; the last segment is the prompt's last token alone. The batch reads into a copy of `prompt`'s layers
    (mlx-lm merges them into its batch caches): `prompt` itself is left as it was."""

    job: Job
    prompt: PromptCache
    segments: list[list[int]]
    sampler: Sampler
    processors: list[LogitsProcessor]
    reply: SequenceReply
    # a segment was read: the detached position there (its tokens, and the MTP head's context if it was kept: solo.py)
    on_segment: Callable[[SavedPosition], None] | None = None
    # (the reply, the cache holding it when `keep_cache` and the MTP head's context over that cache where the
    # sequence read with it to the end: solo.py) once it ended; None: stopped or failed while reading.
    # The loop settles the job after it.
    on_done: Callable[[StreamedReply | None, CacheLayers | None, HeadContext | None], None] = lambda _reply, _cache, _head: None
    keep_cache: bool = False  # hand the sequence's cache to on_done (a chat session goes on from it)
    mtp: MTPMode = MTPMode.OFF  # the MTP head drafts while the sequence is alone (solo.py); the batch decodes plain
    mtp_policy: DepthPolicy | None = None  # the conversation's measurements (None: a fresh one)
    read: int = 0  # prompt tokens read so far
    joined_at: int = 0  # prompt tokens read before it joined the batch (alone first: solo.py)
    start: int = 0  # tokens the cache held at the start
    total: int = 0  # prompt tokens to read
    bounds: list[int] = field(default_factory=list)  # where each segment ends (tokens read), in order

    def __post_init__(self) -> None:
        at = self.start = len(self.prompt)
        for segment in self.segments:
            at += len(segment)
            self.bounds.append(at)
        self.total = at - self.start

    def tokens_until(self, at: int) -> list[int]:
        """The first `at` tokens of the sequence's prompt (those `prompt` holds, then its segments')."""
        tokens = list(self.prompt.tokens)
        for segment in self.segments:
            if len(tokens) >= at:
                break
            tokens.extend(segment)
        return tokens[:at]


Starter = Callable[["LoadedModel"], "Sequence | None"]


class BatchLoop:
    """The batch of one model on an engine's worker (see the module docstring)."""

    def __init__(self, engine: "Engine", limit: int = DEFAULT_LIMIT, prefill_step: int = 2048):
        self.engine = engine
        self.limit = max(1, int(limit))
        self.prefill_step = prefill_step
        self._lock = threading.Lock()
        self._inbox: collections.deque[tuple[Job, Starter]] = collections.deque()
        self._scheduled = False  # a loop job is queued or running and will take what is in the inbox
        self.active = 0  # sequences in the batch now
        self.peak = 0  # the most sequences it has had at once
        self.steps = 0  # generator steps so far (and forward passes of sequences alone)
        self.alone = 0  # sequences that began alone, outside mlx-lm's batch (solo.py)
        self.handed_over = 0  # ... and joined it when another arrived
        self.alone_again = 0  # sequences left alone mid-reply that went on outside the batch
        self.mtp = MTPCounts()  # what the MTP head did for the sequences alone, all of them

    # -- any thread ------------------------------------------------------------------------------------
    def add(self, job: Job, starter: Starter) -> None:
        """Queue a sequence; the loop (started here if none is scheduled) takes it at its next step."""
        with self._lock:
            self._inbox.append((job, starter))
            if self._scheduled:
                return
            self._scheduled = True
        self._schedule()

    def _schedule(self) -> None:
        try:
            self.engine.submit("batch", self._run)
        except RuntimeError:  # a closed engine: whatever waits ends now
            with self._lock:
                self._scheduled = False
                waiting = list(self._inbox)
                self._inbox.clear()
            for job, _ in waiting:
                _end_unstarted(job)

    # -- worker ----------------------------------------------------------------------------------------
    def _run(self, loop_job: Job) -> None:
        m = self.engine.model
        try:
            if m is None:
                self._fail_inbox()
            else:
                self._serve(m)
        finally:
            loop_job.emit(Finished(Reply(kept=False)))
            with self._lock:
                again = bool(self._inbox)
                self._scheduled = again
            if again:  # they arrived while the loop was handing over: the next loop takes them
                self._schedule()

    def _fail_inbox(self) -> None:
        with self._lock:
            waiting = list(self._inbox)
            self._inbox.clear()
        for job, _starter in waiting:
            job.emit(Failed("No model is loaded: load a model first.", ev.NO_MODEL))
            job.settle()

    def _take(self) -> list[tuple[Job, Starter]]:
        with self._lock:
            taken = list(self._inbox)
            self._inbox.clear()
            return taken

    def _serve(self, m: "LoadedModel") -> None:
        from mlx_lm.generate import BatchGenerator

        gen = BatchGenerator(
            m.model,
            completion_batch_size=self.limit,
            prefill_batch_size=min(PREFILL_BATCH, self.limit),
            prefill_step_size=self.prefill_step,
            stop_tokens=[[t] for t in m.tokenizer.eos_token_ids],
        )
        active: dict[int, Sequence] = {}
        try:
            while True:
                if not waiting_jobs():  # another job waits for the worker: finish these, take no more
                    taken = self._take()
                    if len(taken) == 1 and not active:  # alone: outside the batch until another comes (solo.py)
                        self._alone(gen, active, *taken[0], m)
                    else:
                        for job, starter in taken:
                            self._insert(gen, active, job, starter, m)
                elif not active:
                    return
                self.active = len(active)
                self.peak = max(self.peak, self.active)
                if not active:
                    with self._lock:
                        if not self._inbox:
                            return
                    continue
                self._step(gen, active)
                if len(active) == 1 and not self._someone_else():
                    self._alone_again(gen, active, m)
        except Exception as exc:  # an MLX error mid-step: every sequence in the batch ends with it
            log.exception("the batch failed")
            for seq in active.values():
                seq.job.emit(_failure(exc))
                _done(seq, None, None)
            active.clear()
        finally:
            self.active = 0
            gen.close()

    def _insert(self, gen: "BatchGenerator", active: dict[int, Sequence], job: Job, starter: Starter, m: "LoadedModel") -> None:
        seq = _start(job, starter, m)
        if seq is not None:
            _join(gen, active, seq, seq.segments, seq.prompt.layers, seq.prompt.tokens)

    def _alone(self, gen: "BatchGenerator", active: dict[int, Sequence], job: Job, starter: Starter, m: "LoadedModel") -> None:
        """Run a lone sequence outside the batch (solo.py) until it ends or another arrives: then it joins the batch."""
        seq = _start(job, starter, m)
        if seq is None:
            return
        self.active = self.peak = max(self.peak, 1)
        self.alone += 1
        solo = SoloRun(m, seq, self.prefill_step)
        self._solo(gen, active, seq, solo, lambda: solo.run(self._someone_waits))

    def _alone_again(self, gen: "BatchGenerator", active: dict[int, Sequence], m: "LoadedModel") -> None:
        """The one sequence left mid-reply goes on outside the batch (solo.py: faster, and drafts with the MTP head)
        until it ends or another arrives. Left in the batch when it is not decoding yet (still reading), or when
        this mlx-lm's generator does not show the token it sampled for it."""
        ((uid, seq),) = active.items()
        token = _sampled_not_read(gen, uid)
        if token is None or seq.job.stopped:
            return
        ((layers, tokens),) = gen.remove([uid], return_prompt_caches=True).values()
        del active[uid]
        self.alone_again += 1
        solo = SoloRun(m, seq, self.prefill_step, at=HandOver(layers, list(tokens), []))
        self._solo(gen, active, seq, solo, lambda: solo.go_on(token, self._someone_waits))

    def _solo(self, gen: "BatchGenerator", active: dict[int, Sequence], seq: Sequence, solo: SoloRun, run: Callable[[], HandOver | Ended]) -> None:
        """Run `seq` alone (`run`: solo.run or solo.go_on) and end it, or insert it into the batch where it stopped."""
        before = replace(seq.reply.mtp)  # its counts grow in place; a sequence may be alone more than once
        try:
            outcome = run()
        except Exception as exc:  # an MLX error: this sequence ends with it
            log.exception("the lone sequence failed")
            seq.job.emit(_failure(exc))
            _done(seq, None, None)
            return
        finally:
            self.steps += solo.steps
            self.mtp = self.mtp.plus(seq.reply.mtp.minus(before))
        match outcome:
            case Ended(layers=layers, reply_done=True, head=head):
                _done(seq, seq.reply.finish(), *((layers, head) if seq.keep_cache else (None, None)))
            case Ended():
                _done(seq, None, None)
            case _:
                self.handed_over += 1
                seq.joined_at = seq.read
                _join(gen, active, seq, outcome.segments, outcome.layers, outcome.tokens)

    def _someone_else(self) -> bool:
        """A sequence waits to be taken, or another job waits for the worker (the batch then hands it over)."""
        with self._lock:
            return bool(self._inbox) or waiting_jobs() > 0

    def _someone_waits(self) -> bool:
        """Another sequence the batch may take arrived (a job waiting for the worker is not one: it waits for this)."""
        with self._lock:
            return bool(self._inbox) and not waiting_jobs()

    def _step(self, gen: "BatchGenerator", active: dict[int, Sequence]) -> None:
        prompt_responses, responses = gen.next()
        self.steps += 1
        remove: list[int] = []  # stopped while reading their prompt
        ended: list[int] = []  # replies this loop ended (a stop, the context's room)
        for r in prompt_responses:
            seq = active.get(r.uid)
            if seq is None:
                continue
            done, _total = r.progress
            done += seq.joined_at
            seq.read = done
            if seq.job.stopped and not r.end_of_prompt:
                remove.append(r.uid)
                continue
            if not r.end_of_prompt:
                seq.job.emit(PromptProgress(min(done, seq.total), seq.total))
            if r.end_of_segment and not r.end_of_prompt and seq.on_segment is not None:
                at = seq.start + done
                if at in seq.bounds:
                    ((cache, _tokens),) = gen.extract_cache([r.uid]).values()
                    seq.on_segment(save(cache, seq.tokens_until(at)))
        reinsert: list[tuple[int, Sequence]] = []
        for r in responses:
            seq = active.get(r.uid)
            if seq is None:
                continue
            match seq.reply.take(r.token, r.finish_reason):
                case Next.END if r.finish_reason is not None:  # the generator has let it go, with its cache
                    del active[r.uid]
                    _done(seq, seq.reply.finish(), r.prompt_cache if seq.keep_cache else None)
                case Next.END:
                    ended.append(r.uid)
                case Next.CLOSE_REASONING:
                    reinsert.append((r.uid, seq))
                case Next.GO_ON:
                    pass
        if remove:
            for uid in remove:
                _done(active.pop(uid), None, None)
            gen.remove(remove)
        if ended:
            keep = [uid for uid in ended if active[uid].keep_cache]
            caches = gen.remove(ended, return_prompt_caches=bool(keep))
            for uid in ended:
                seq = active.pop(uid)
                _done(seq, seq.reply.finish(), caches[uid][0] if uid in keep else None)
        for uid, seq in reinsert:
            ((cache, tokens),) = gen.remove([uid], return_prompt_caches=True).values()
            del active[uid]
            (new,) = gen.insert_segments(
                [[seq.reply.segment]],
                max_tokens=[seq.reply.max_tokens()],
                caches=[cache],
                all_tokens=[list(tokens)],
                samplers=[seq.sampler],
                logits_processors=[seq.processors],
            )
            active[new] = seq


def _start(job: Job, starter: Starter, m: "LoadedModel") -> Sequence | None:
    """The starter's sequence; None when it ended already (its terminal event is out) or failed to start."""
    try:
        seq = starter(m)
    except Exception as exc:  # the starter's refusal (EngineError) or a bug: this sequence alone fails
        if not isinstance(exc, EngineError):
            log.exception("starting a batched sequence failed")
        job.emit(_failure(exc))
        job.settle()
        return None
    if seq is None:
        job.settle()
    return seq


def _join(gen: "BatchGenerator", active: dict[int, Sequence], seq: Sequence, segments: list[list[int]], layers: CacheLayers, tokens: list[int]) -> None:
    """Insert `seq` into the batch: `layers` hold `tokens`, `segments` are still to read."""
    (uid,) = gen.insert_segments(
        [segments],
        max_tokens=[seq.reply.max_tokens()],
        caches=[layers],
        all_tokens=[list(tokens)],  # a copy: the generator appends to it
        samplers=[seq.sampler],
        logits_processors=[seq.processors],
    )
    active[uid] = seq


def _sampled_not_read(gen: "BatchGenerator", uid: int) -> int | None:
    """The token mlx-lm's generator sampled for `uid` and reads at its next step; None when `uid` is not decoding
    (still reading its prompt) or this mlx-lm keeps it elsewhere (GenerationBatch's own fields: no public call)."""
    batch = getattr(gen, "_generation_batch", None)
    uids, sampled = getattr(batch, "uids", None), getattr(batch, "_next_tokens", None)
    if not isinstance(uids, list) or sampled is None or uid not in uids:
        return None
    return int(cast(int, sampled[uids.index(uid)].item()))  # a token id (mlx types item() as any scalar)


def _done(seq: Sequence, streamed: StreamedReply | None, cache: CacheLayers | None, head: HeadContext | None = None) -> None:
    try:
        seq.on_done(streamed, cache, head)
    finally:
        seq.job.settle()


def _failure(exc: Exception) -> Failed:
    if isinstance(exc, EngineError):
        return Failed(exc.message, exc.code)
    return Failed(f"Unexpected engine error: {type(exc).__name__}: {exc}", ev.ERROR)


def _end_unstarted(job: Job) -> None:
    job.emit(Failed("The engine was closed before this request started.", ev.CANCELLED))
    job.settle()
