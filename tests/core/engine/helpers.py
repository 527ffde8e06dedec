"""Helpers for the engine tests: run work on the worker, compare a cache against a fresh run, template prompts."""

from __future__ import annotations

import copy

from macapp.core.events import Finished, Reply
from macapp.core.sampling import greedy, make_sampler_and_processors
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING

REASONING = "".join(SCRIPT_REASONING)
ANSWER = "".join(SCRIPT_ANSWER)
TIMEOUT = 60
EXACT = 1e-4  # float32 noise between chunked and one-shot evaluation is ~1e-6


def on_worker(engine, fn):
    """Run fn(loaded model) on the engine's worker thread (MLX work stays on one thread)."""
    box = {}

    def work(job):
        box["value"] = fn(engine.model)
        job.emit(Finished(Reply()))

    engine.submit("test", work).result(timeout=TIMEOUT)
    return box["value"]


def fresh_tokens(engine, prompt_ids, params):
    """What raw mlx-lm generates from scratch for this exact token sequence."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    def run(m):
        sampler, processors = make_sampler_and_processors(params)
        return [
            r.token
            for r in stream_generate(m.model, m.tokenizer, mx.array(prompt_ids), max_tokens=params.max_tokens, sampler=sampler, logits_processors=processors)
        ]

    return on_worker(engine, run)


def logit_error(engine, cache, tokens, probe=7, skip=0):
    """Max |logit difference| between `cache` + one probe token and a fresh run over `tokens` + the probe.

    The cache is deep-copied, so it is untouched. `skip` drops leading tokens from the fresh run (a deliberately
    wrong reference, to show the check can fail)."""
    import mlx.core as mx

    def run(m):
        cached = m.model(mx.array([[probe]]), cache=copy.deepcopy(cache))[0, -1]
        fresh = m.model(mx.array([list(tokens)[skip:] + [probe]]))[0, -1]
        return mx.abs(cached - fresh).max().item()

    return on_worker(engine, run)


def cache_error(engine, session, probe=7, skip=0):
    """logit_error for a session's cache and the tokens it accounts for."""
    return logit_error(engine, session.cache, session.tokens, probe=probe, skip=skip)


def template(engine, messages, thinking):
    return list(engine.model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking))


def kv_offsets(session):
    """The length of every trimmable (KV) layer of the session's cache."""
    return [c.offset for c in session.cache if c.is_trimmable()]


def joined(events, cls):
    return "".join(e.text for e in events if isinstance(e, cls))


# A conversation for the MTP head's context: send (thinking), send, regenerate, send (thinking).
HEAD_CONTEXT_TURNS = [
    lambda s: s.send("hello there", thinking=True, sampling=greedy(40)),
    lambda s: s.send("and now?", thinking=False, sampling=greedy(40)),
    lambda s: s.regenerate(sampling=greedy(30)),
    lambda s: s.send("one more", thinking=True, sampling=greedy(40)),
]


def assert_head_context_covers_every_token(session) -> None:
    """The session's MTP head context never started again: it followed every token from the first."""
    context = session._live.head
    assert context is not None and context.base == 0
    assert context.end == len(session.tokens) - 1 and context.carry[0] == len(session.tokens) - 1


def stream_alone(
    m,
    cache,
    segment,
    *,
    held,
    limit,
    params,
    thinking,
    budget=None,
    should_stop=lambda: False,
    emit=lambda _e: None,
    clock=None,
    kv=None,
    mtp=None,
    mtp_policy=None,
    mtp_context=None,
):
    """One reply by the lone executor (engine/solo.py, run_alone), as every chat turn and request runs alone: `cache`
    (mlx-lm layers) holds the tokens `held`; `segment` is read before the first sampled token. On the worker."""
    from macapp.core.engine import Job, Limits, Sequence, SequenceReply, TurnClock, run_alone
    from macapp.core.engine.options import KVQuantization, MTPMode
    from macapp.core.engine.prompt_cache import PromptCache

    if clock is None:
        clock = TurnClock()
        clock.reading(len(segment))
    sampler, processors = make_sampler_and_processors(params)
    reply = SequenceReply(
        m,
        limits=Limits(cached=len(held), limit=limit),
        segment=list(segment),
        params=params,
        thinking=thinking,
        budget=budget,
        should_stop=should_stop,
        emit=emit,
        clock=clock,
    )
    seq = Sequence(
        job=Job("test"),
        prompt=PromptCache(cache, held, head=mtp_context),
        segments=[list(segment)],
        sampler=sampler,
        processors=processors,
        reply=reply,
        kv=kv or KVQuantization(),
        mtp=mtp or MTPMode.OFF,
        mtp_policy=mtp_policy,
    )
    return run_alone(m, seq)
