"""A prepared request as one sequence of the batch (macapp.core.engine.batch), on the engine's worker.

When the batch takes the request: restore the longest checkpoint of its prompt (pool.py) as the sequence's
cache, split the rest of the prompt at the checkpoint boundaries after it (the batch pauses there and the
checkpoint is taken: `on_segment`), and answer with the same events, usage and Completed as a request run
alone (runner.py): the reply's text goes through the same ReplyText (tool calls, stop sequences).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import Job, LoadedModel, StreamedReply, TurnClock
from macapp.core.engine.batch import Sequence
from macapp.core.engine.batch_reply import Limits, SequenceReply
from macapp.core.events import PromptProgress
from macapp.core.sampling import make_sampler_and_processors
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.positions import SavedPosition
from macapp.core.serving.prepared import PreparedRequest
from macapp.core.serving.reply_text import ReplyText, cancelled, completed
from macapp.core.serving.requests import RequestStarted, Usage

if TYPE_CHECKING:
    from macapp.core.serving.runner import ServingEngine


def start(serving: "ServingEngine", job: Job, prepared: PreparedRequest, m: LoadedModel, submitted: float) -> Sequence | None:
    """The sequence for `prepared`, or None when it ended already (stopped while it waited)."""
    clock = TurnClock()
    if job.stopped:
        job.emit(cancelled(m, Usage()))
        return None
    prepared = serving.current(prepared)
    request, rendered = prepared.request, prepared.rendered
    tokens = rendered.tokens
    settings = serving.settings(m, prepared, len(tokens))
    params, budget, limit = settings.params, settings.budget, settings.limit
    pool = serving.pool_for(m)
    key = tuple(tokens)
    cache, source = pool.resume(key, m)
    cached = len(cache)
    usage = Usage(prompt_tokens=len(tokens), cached_tokens=cached)
    job.emit(RequestStarted(usage.prompt_tokens, usage.cached_tokens, source))
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

    def on_segment(position: SavedPosition) -> None:
        pool.add_saved(position)

    def on_done(streamed: StreamedReply | None, _cache: CacheLayers | None, _head: HeadContext | None) -> None:
        serving.measured(time.perf_counter() - submitted)
        job.emit(cancelled(m, usage) if streamed is None else completed(m, text, streamed, usage))

    return Sequence(
        job=job,
        prompt=cache,
        segments=_segments(tokens, cached, rendered.boundaries),
        sampler=sampler,
        processors=processors,
        reply=reply,
        on_segment=on_segment,
        on_done=on_done,
        mtp=serving.options.session.mtp,  # drafts while it is alone (engine/solo.py)
        mtp_policy=serving.mtp_policy_for(m),
    )


def _segments(tokens: list[int], cached: int, boundaries: tuple[int, ...]) -> list[list[int]]:
    """The prompt after `cached`, cut at each checkpoint boundary after it; the last token alone at the end."""
    cuts = [b for b in boundaries if cached < b < len(tokens) - 1] + [len(tokens) - 1, len(tokens)]
    out, at = [], cached
    for cut in cuts:
        if cut > at:
            out.append(tokens[at:cut])
            at = cut
    return out
