"""A chat turn as one sequence of the engine's batch: the batched half of ChatSession (session.py).

While the local API serves from the engine, a turn of the window's chat joins the API's batch instead of
waiting for it (engine/batch.py): the batch reads the turn's prompt and streams the reply beside the agents'
requests, with the same events, statistics, thinking budget and stop as `ChatSession._read_and_stream`, and the session
goes on from the cache the batch hands back.

The batch reads and writes copies of the caches it is given (mlx-lm merges them into its own batch caches), so
nothing of the session changes until the turn is over: a stop while reading undoes the turn by changing nothing
but the plan's rewind, and the reply's cache comes back in `on_done`. Two points are taken from the batch: the
cache before the prompt's last token (regenerate's snapshot, from the segment's end) and the cache after the
reply. Each is a copy of the KV cache (mlx-lm's `extract`), the price of sharing the batch. A turn that ran alone
in the batch (solo.py) with the MTP head hands its head's context back too, so the conversation's goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.batch import Sequence
from macapp.core.engine.batch_reply import Limits, SequenceReply
from macapp.core.engine.clock import TurnClock
from macapp.core.engine.jobs import Job
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.positions import SavedPosition
from macapp.core.engine.reply import StreamedReply
from macapp.core.engine.turns import TurnMemory, TurnPlan
from macapp.core.events import Finished, PromptProgress, Reply
from macapp.core.sampling import SamplingParams, make_sampler_and_processors

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.session import ChatSession


@dataclass
class _Read:
    before_last: SavedPosition | None = None  # just before the prompt's last token (from the batch), with the MTP
    # head's context there where the prompt was read with it
    undone: bool = False  # a stop while reading already answered the turn (Job.stop's early Finished)


def sequence(
    session: "ChatSession",
    job: Job,
    m: "LoadedModel",
    clock: TurnClock,
    plan: TurnPlan,
    params: SamplingParams,
    budget: int | None,
    limit: int,
) -> Sequence:
    """The batch's sequence for `plan` on `session` (worker thread, when the batch takes it)."""
    if plan.rereads:
        session.forget_cache()
        session._model = m
    previous = session._turn
    turn_start = session._rewind(m, plan)
    session._messages = list(plan.history)
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
            session._undo(m, plan, turn_start, previous)
            stopped.reply.stats.elapsed_s = clock.elapsed()
            job.emit(stopped)  # ignored if stop() already sent it
            return
        prompt = session._live
        if head:
            if read.before_last is None:
                raise RuntimeError("the batch finished a two-segment prompt without reporting its first segment")
            before_last = read.before_last.as_mark()  # its KV buffers are the batch's copy: lengths do
            session._shelve(read.before_last)  # detached: a reopened conversation's prompt starts the same
        else:
            before_last = prompt.mark()
        session._turn = TurnMemory(
            before_turn=turn_start,
            close_before=plan.close_before,
            prefix=plan.prefix,
            before_last=before_last,
            last_token=last[0],
            mode=plan.mode,
        )
        session._messages.append(session._user_message(plan))
        prompt.adopt(cache, head, context)
        if context is not None and read.before_last is not None:
            context.keep_mark(read.before_last)  # regenerate's rewind to before_last goes on pairing
        session._settle_reply(m, plan, streamed)
        job.emit(Finished(streamed.reply))

    sampler, processors = make_sampler_and_processors(params)
    reply = SequenceReply(
        m,
        limits=Limits(cached=len(session.tokens) + len(head), limit=limit),
        segment=last,
        params=params,
        thinking=plan.mode.thinking,
        budget=budget,
        should_stop=job.stop_event.is_set,
        emit=job.emit,
        clock=clock,
    )
    return Sequence(
        job=job,
        prompt=session._live,
        segments=[s for s in (head, last) if s],
        sampler=sampler,
        processors=processors,
        reply=reply,
        on_segment=on_segment,
        on_done=on_done,
        keep_cache=True,
        mtp=session.options.mtp,
        mtp_policy=session.mtp_policy,
    )
