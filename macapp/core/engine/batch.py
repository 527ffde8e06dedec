"""Continuous batching: many sequences decoding together on the worker, through mlx-lm's BatchGenerator.

    loop = BatchLoop(engine, limit=8)
    loop.add(starter)      # any thread: `starter(model)` runs on the worker when the batch takes it and returns
                           # the Sequence to insert (or None: it ended already, e.g. stopped while waiting)

Sequences join and leave the running batch at token boundaries: the loop inserts what arrived since the last
step, calls the generator's `next()` once (one decode step for the batch and one prefill chunk for those still
reading), and hands each sequence its token (`SequenceReply.take`). Each keeps its own sampler, logits
processors, max tokens, thinking budget, stop and cancellation; prompts are inserted in segments so the
generator pauses at their boundaries and the caller can checkpoint there (`Sequence.on_segment`).

Every chat turn and every API request is a sequence of this loop, whether a server is up or not. A sequence that
arrives at an empty batch runs alone, outside the generator, until another arrives (solo.py says why); one left
alone mid-reply when the others end goes back to running alone. A sequence that cannot share mlx-lm's batch runs
alone to its end while the batch waits: pictures (mlx-vlm's positions), a KV quantization unlike the batch's, and
every sequence of an engine that cannot batch (several Macs: one model call at a time).

What BatchGenerator lacks and this adds (a wrapper, not a second batching engine): the thinking budget, which
must feed tokens the model did not sample (the sequence is taken out with its cache and inserted again with the
closing tag to read); a stop asked from another thread; and fair turns with the rest of the worker's jobs (a
load, an unload, a session's reset): while one waits for the worker, the loop takes no new sequence, lets the
ones it has finish and hands the worker over; sequences that arrived meanwhile wait for the next loop.

The loop is a Job of kind "batch" on the engine's worker (one at a time per BatchLoop). Its sequences have Jobs
of their own, which the caller made and owns.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Protocol

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.reply import Next
from macapp.core.engine.jobs import Job
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import MTPCounts
from macapp.core.engine.positions import SavedPosition, save
from macapp.core.engine.prefill import wired_memory
from macapp.core.engine.sequence import Sequence, Starter
from macapp.core.engine.reply import StreamedReply
from macapp.core.engine.solo import Ended, HandOver, SoloRun
from macapp.core.upstream import quantized_layers, sampled_not_read
from macapp.core.engine.worker import waiting_jobs
from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.events import Failed, Finished, PromptProgress, Reply

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator

    from macapp.core.engine.model_folder import LoadedModel

log = logging.getLogger(__name__)

PREFILL_BATCH = 8  # prompts read together (mlx-lm's server default)
DEFAULT_LIMIT = 32  # sequences decoding together (mlx-lm's server default)


class Worker(Protocol):
    """What the loop needs of its engine (engine.Engine): the loaded model, and jobs on the one MLX thread."""

    @property
    def model(self) -> "LoadedModel | None": ...

    batches: bool  # False: every sequence alone, one at a time (several Macs' lockstep carries one call at a time)

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job: ...


class BatchLoop:
    """The batch of one model on an engine's worker (see the module docstring)."""

    def __init__(self, engine: Worker, limit: int = DEFAULT_LIMIT, prefill_step: int = 2048):
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

    def _take(self, everything: bool) -> list[tuple[Job, Starter]]:
        """What waits in the inbox: all of it, or the first alone (an engine that cannot batch)."""
        with self._lock:
            if not everything:
                return [self._inbox.popleft()] if self._inbox else []
            taken = list(self._inbox)
            self._inbox.clear()
            return taken

    def _serve(self, m: "LoadedModel") -> None:
        import mlx.core as mx
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
            with wired_memory(m):
                while True:
                    if not waiting_jobs():  # another job waits for the worker: finish these, take no more
                        taken = self._take(everything=self.engine.batches)
                        for n, (job, starter) in enumerate(taken):
                            self._admit(gen, active, job, starter, m, last=n == len(taken) - 1)
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
                _failed(seq, exc)
            active.clear()
        finally:
            self.active = 0
            gen.close()
            mx.clear_cache()

    def _admit(self, gen: "BatchGenerator", active: dict[int, Sequence], job: Job, starter: Starter, m: "LoadedModel", last: bool) -> None:
        """Start a sequence taken from the inbox and place it: alone to its end (pictures, a KV kind unlike the
        batch's, an engine that cannot batch: the batch waits meanwhile), alone until another arrives (the last one
        taken, at an empty batch: solo.py), or into mlx-lm's batch."""
        seq = _start(job, starter, m)
        if seq is None:
            return
        alone = (
            not self.engine.batches
            or seq.must_run_alone
            or seq.reply.max_tokens() <= 0  # no room for a first token: it ends at once, alone (solo.py)
            or any(other.kv != seq.kv for other in active.values())
        )
        if alone or (last and not active):
            self.active = self.peak = max(self.peak, 1)
            self.alone += 1
            solo = SoloRun(m, seq)
            self._solo(gen, active, seq, solo, lambda: solo.run(_never if alone else self._someone_waits))
        else:
            _join(gen, active, seq, seq.segments, seq.prompt.layers, seq.prompt.tokens)

    def _alone_again(self, gen: "BatchGenerator", active: dict[int, Sequence], m: "LoadedModel") -> None:
        """The one sequence left mid-reply goes on outside the batch (solo.py: faster, and drafts with the MTP head)
        until it ends or another arrives. Left in the batch when it is not decoding yet (still reading), or when
        this mlx-lm's generator does not show the token it sampled for it."""
        ((uid, seq),) = active.items()
        token = sampled_not_read(gen, uid)
        if token is None or seq.job.stopped:
            return
        ((layers, tokens),) = gen.remove([uid], return_prompt_caches=True).values()
        del active[uid]
        self.alone_again += 1
        solo = SoloRun(m, seq, at=HandOver(layers, list(tokens), []))
        self._solo(gen, active, seq, solo, lambda: solo.go_on(token, self._someone_waits))

    def _solo(self, gen: "BatchGenerator", active: dict[int, Sequence], seq: Sequence, solo: SoloRun, run: Callable[[], HandOver | Ended]) -> None:
        """Run `seq` alone (`run`: solo.run or solo.go_on) and end it, or insert it into the batch where it stopped."""
        before = replace(seq.reply.mtp)  # its counts grow in place; a sequence may be alone more than once
        try:
            outcome = run()
        except Exception as exc:  # an MLX error: this sequence ends with it
            log.exception("the lone sequence failed")
            _failed(seq, exc)
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
                    seq.on_segment(_CopyEnd(save(cache, seq.tokens_until(at))))
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
    if seq.kv.bits is not None:
        layers = quantized_layers(layers, seq.kv)
    (uid,) = gen.insert_segments(
        [segments],
        max_tokens=[seq.reply.max_tokens()],
        caches=[layers],
        all_tokens=[list(tokens)],  # a copy: the generator appends to it
        samplers=[seq.sampler],
        logits_processors=[seq.processors],
    )
    active[uid] = seq


def _done(seq: Sequence, streamed: StreamedReply | None, cache: CacheLayers | None, head: HeadContext | None = None) -> None:
    try:
        seq.on_done(streamed, cache, head)
    finally:
        seq.job.settle()


def _failed(seq: Sequence, exc: Exception) -> None:
    seq.job.emit(_failure(exc))
    try:
        seq.on_failed()
    finally:
        _done(seq, None, None)


def _failure(exc: Exception) -> Failed:
    if isinstance(exc, EngineError):
        return Failed(exc.message, exc.code)
    return Failed(f"Unexpected engine error: {type(exc).__name__}: {exc}", ev.ERROR)


class _CopyEnd:
    """A segment's end in the batch: a detached position of mlx-lm's copy of the sequence's cache (sequence.SegmentEnd);
    its mark rewinds the copy the sequence ends with (lengths and DeltaNet references)."""

    def __init__(self, position: SavedPosition):
        self.position, self.length = position, position.length

    def mark(self) -> SavedPosition:
        return self.position.as_mark()

    def save(self) -> SavedPosition:
        return self.position


def _never() -> bool:
    return False


def _end_unstarted(job: Job) -> None:
    job.emit(Failed("The engine was closed before this request started.", ev.CANCELLED))
    job.settle()
