"""One reply stream: mlx-lm's stream_generate over a prepared cache, split into reasoning and answer as it comes.

`stream_reply` is not tied to a chat session: any core code with a loaded model, a prompt cache and the
tokens still to feed (the API server's runner, for one) gets the engine's events, statistics, thinking
budget, stop and context cap from it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Generator, NamedTuple

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import mtp_decode
from macapp.core.engine.clock import STATS_INTERVAL_S, TurnClock
from macapp.core.engine.mtp_policy import DepthPolicy, MTPCounts
from macapp.core.engine.options import KVQuantization, MTPMode
from macapp.core.events import AnswerDelta, Event, GenerationStats, PromptProgress, ReasoningDelta, Reply, StatsUpdate
from macapp.core.sampling import SamplingParams, make_sampler_and_processors
from macapp.core.fit.estimate import DEFAULT_PREFILL_STEP
from macapp.core.thinking import ANSWER, ThinkingSplitter

if TYPE_CHECKING:
    from mlx_lm.generate import GenerationResponse

    from macapp.core.engine.model_folder import LoadedModel, Tokenizer
    from macapp.core.engine.mtp_context import HeadContext
    from macapp.core.engine.prompt_cache import PromptCache

Emit = Callable[[Event], None]


class StreamedReply(NamedTuple):
    reply: Reply
    still_reasoning: bool  # the reply ended inside its reasoning: whoever continues must close it first
    tokens_added: list[int]  # every token this stream put in the cache, in order (segment, forced, sampled)


class _Stream:
    """What one stream_reply call counts as it goes (the per-token loop copies it into locals)."""

    def __init__(
        self,
        model: "LoadedModel",
        cache: CacheLayers,
        cached: int,
        params: SamplingParams,
        kv: KVQuantization,
        prefill_step: int,
        splitter: ThinkingSplitter,
        budget: int | None,
        should_stop: Callable[[], bool],
        emit: Emit,
        clock: TurnClock,
        policy: DepthPolicy | None,
        context: "HeadContext | None" = None,
    ):
        self.model, self.cache, self.cached, self.params = model, cache, cached, params
        self.context = context  # the MTP head's context over `cache` (mtp_context.py), if the caller keeps one
        self.kv, self.prefill_step, self.splitter, self.budget = kv.kwargs(), prefill_step, splitter, budget
        self.policy = policy  # None: plain decoding (no head, MTP off, or a cache MTP cannot roll back)
        self.mtp = MTPCounts()
        self.should_stop, self.emit, self.clock = should_stop, emit, clock
        self.sampler, self.processors = make_sampler_and_processors(params)
        self.generated: list[int] = []  # sampled tokens (the reply's token_ids)
        self.added: list[int] = []  # tokens put in the cache so far
        self.reasoning = 0  # sampled tokens inside the reasoning
        self.forced = 0  # tokens fed to close the reasoning (the budget)
        self.budget_hit = False
        self.last_token_at = 0.0
        self.next_stats = 0.0


def deliver(emit: Emit, pieces: list[tuple[str, str]]) -> None:
    for kind, piece in pieces:
        emit(AnswerDelta(piece) if kind == ANSWER else ReasoningDelta(piece))


def stream_reply(
    model: "LoadedModel",
    cache: CacheLayers,
    segment: list[int],
    *,
    cached: int,
    limit: int,
    params: SamplingParams,
    thinking: bool,
    budget: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    emit: Emit,
    clock: TurnClock,
    kv: KVQuantization = KVQuantization(),
    prefill_step: int = DEFAULT_PREFILL_STEP,
    mtp: MTPMode = MTPMode.AUTO,
    mtp_policy: DepthPolicy | None = None,
    mtp_context: "HeadContext | None" = None,
) -> StreamedReply:
    """Generate one reply into `cache` and stream it as events; return the Reply and what went into the cache.

    - `cache`: a prompt cache of `model` (mlx-lm's make_prompt_cache) holding `cached` tokens; `segment`: the
      tokens still to feed before the first sampled one (at least one: usually the prompt's last token, after
      `prefill` read the rest). The cache ends holding `cached + len(tokens_added)` tokens.
    - `limit`: the context limit; the reply ends with finish_reason "context" when the cache is full.
    - `params`: sampling (its max_tokens caps the sampled tokens; its seed, if any, seeds MLX now).
    - `thinking`: the prompt opened a reasoning block (Qwen3.5's template with enable_thinking); the text is
      split into ReasoningDelta / AnswerDelta. `budget`: after that many reasoning tokens ``</think>`` is fed
      (counted as forced tokens) and the model answers; 0 means the prompt itself already closed it.
    - `should_stop()`: asked after every token; yes ends the reply with finish_reason "stopped" (kept).
    - `emit(event)`: gets PromptProgress (prompt read, at the first token), the text deltas, and a StatsUpdate
      at most every STATS_INTERVAL_S; the caller emits the terminal event. Called on this (the worker) thread.
    - `clock`: the turn's TurnClock (call its `reading()` before the prefill): TTFT and rates are timed by it.
    - `mtp`: speculative decoding with the build's MTP head (`model.mtp_head`; mtp_decode.py), the same
      tokens (greedy) or the same distribution (sampling); `mtp_policy`: the conversation's measurements and
      "auto"'s decision, kept across its turns (None: a fresh one for this reply); `mtp_context`: the head's own
      context over `cache` (PromptCache.head_context; None: the head starts empty).

    Run on the engine's worker thread (Engine.submit), inside prefill.wired_memory(model). Per token this adds
    a list append, the splitter's string work and the event to mlx-lm's own loop.
    """
    import mlx.core as mx

    splitter = ThinkingSplitter(in_reasoning=thinking and budget != 0)
    policy = pick_policy(model, cache, kv, mtp, mtp_policy)
    run = _Stream(model, cache, cached, params, kv, prefill_step, splitter, budget, should_stop, emit, clock, policy, mtp_context)
    if params.seed is not None:
        mx.random.seed(params.seed)
    remaining = params.max_tokens
    segment = list(segment)
    while True:
        room = limit - cached - len(run.added) - len(segment)  # tokens the reply may still add to the cache
        cap = min(remaining, room)
        if cap <= 0:
            finish = "context" if room <= 0 else "length"
            break
        taken, finish, over_budget = _generate(run, segment, cap)
        remaining -= taken
        if over_budget:
            if remaining <= 0:
                finish = "length"
                break
            segment = _close_reasoning(run)
            continue
        if finish == "length" and taken == cap and cap < remaining + taken:
            finish = "context"  # the context limit, not max_tokens, ended the reply
        break
    return _finish(run, thinking, finish)


def pick_policy(model: "LoadedModel", cache: CacheLayers, kv: KVQuantization, mode: MTPMode, policy: DepthPolicy | None) -> DepthPolicy | None:
    """The policy a stream over `cache` drafts with, or None for plain decoding (here and for a lone sequence of
    the batch: solo.py). In "auto" it starts from the head's calibrated verdict, if it has one."""
    if mode is MTPMode.OFF or not mtp_decode.usable(model, getattr(model, "mtp_head", None), cache, kv.bits):
        return None
    policy = policy if policy is not None else DepthPolicy()
    policy.mode = mode
    verdict = model.mtp_head.verdict if model.mtp_head is not None else None
    if mode is MTPMode.AUTO and verdict is not None:
        policy.follow(verdict)
    return None if policy.off and mode is MTPMode.AUTO else policy


def head_context(model: "LoadedModel", prompt: "PromptCache", policy: DepthPolicy | None) -> "HeadContext | None":
    """The MTP head's context over `prompt` (PromptCache.head_context) when a stream over it drafts now with the
    policy pick_policy gave (None: plain decoding, so the prompt is read without feeding the head)."""
    if model.mtp_head is None or policy is None or not drafting(policy):
        return None
    return prompt.head_context(model.mtp_head)


def drafting(policy: DepthPolicy) -> bool:
    """Whether a stream with `policy` (pick_policy's) drafts now: not once "auto" turned MTP off."""
    return not (policy.off and policy.mode is MTPMode.AUTO)


def _token_source(run: _Stream, segment: list[int], cap: int) -> Generator["mtp_decode.Token | GenerationResponse", None, None]:
    """mlx-lm's stream_generate, or the MTP head's speculative stream (the same contract: mtp_decode)."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    m = run.model
    policy = run.policy
    head = m.mtp_head
    if policy is not None and head is not None and drafting(policy):
        return mtp_decode.mtp_stream(
            m,
            head,
            run.cache,
            segment,
            cached=run.cached + len(run.added),
            max_tokens=cap,
            params=run.params,
            sampler=run.sampler,
            processors=run.processors,
            policy=policy,
            counts=run.mtp,
            context=run.context,
        )
    return stream_generate(
        m.model,
        m.tokenizer,
        mx.array(segment),
        max_tokens=cap,
        sampler=run.sampler,
        logits_processors=run.processors,
        prompt_cache=run.cache,
        prefill_step_size=run.prefill_step,
        **run.kv,
    )


def with_mtp(stats: GenerationStats, counts: MTPCounts) -> GenerationStats:
    """`stats` with the MTP figures of `counts` (unchanged when MTP did not run)."""
    if counts.steps:
        stats.mtp_steps, stats.mtp_drafted, stats.mtp_accepted = counts.steps, counts.drafted, counts.accepted
        stats.mtp_acceptance, stats.mtp_tokens_per_step = counts.acceptance_rate, counts.tokens_per_step
        stats.mtp_passes = counts.passes
    return stats


def leading_space(tokenizer: Tokenizer, tokens: list[int], text: str) -> str:
    """mlx-lm's BPE streaming detokenizer drops the leading space of a stream's first text (as if nothing came
    before it); here the prompt did, and a reply that goes on from a partial one ("The answer" + " is") needs it."""
    if text.startswith(" ") or not tokenizer.decode(tokens).startswith(" "):
        return text
    return " " + text


def _generate(run: _Stream, segment: list[int], cap: int) -> tuple[int, str, bool]:
    """Feed `segment` and sample up to `cap` tokens with one stream_generate (or the MTP stream), until it
    finishes, a stop is asked or the thinking budget is spent. Returns (tokens sampled, finish reason, whether
    the budget ended it)."""
    m = run.model
    gen = _token_source(run, segment, cap)
    run.added.extend(segment)
    # The loop below runs once per token: locals only, and nothing but cheap work.
    emit, should_stop, budget, clock, splitter = run.emit, run.should_stop, run.budget, run.clock, run.splitter
    feed = splitter.feed
    generated = run.generated
    append = generated.append
    perf = time.perf_counter
    reasoning, next_stats, last, first = run.reasoning, run.next_stats, run.last_token_at, clock.first_token_at
    base = run.cached + len(run.added)
    taken = 0
    finish = "length"
    over_budget = False
    lead = True  # no text out of this stream yet (see leading_space)
    try:
        for r in gen:
            now = perf()
            if not first:
                first = now
                clock.first_token(now)
                emit(PromptProgress(clock.prompt_tokens, clock.prompt_tokens))
            last = now
            append(r.token)
            taken += 1
            if splitter.in_reasoning:
                reasoning += 1
            if r.text:
                text = r.text
                if lead:
                    lead = False
                    text = leading_space(m.tokenizer, generated[len(generated) - taken :], text)
                deliver(emit, feed(text))
            if r.finish_reason is not None:
                finish = r.finish_reason
                break
            if should_stop():
                finish = "stopped"
                break
            if budget is not None and reasoning >= budget and splitter.in_reasoning:
                over_budget = True
                break
            if now >= next_stats:
                next_stats = now + STATS_INTERVAL_S
                stats = clock.stats(
                    last_token_at=now,
                    now=now,
                    generated=len(generated),
                    reasoning=reasoning,
                    forced=run.forced,
                    context=base + taken,
                    finish=None,
                )
                emit(StatsUpdate(with_mtp(stats, run.mtp)))
    finally:
        gen.close()
        run.reasoning, run.next_stats, run.last_token_at = reasoning, next_stats, last
        run.added.extend(generated[len(generated) - taken :])
    return taken, finish, over_budget


def close_text_for(splitter: ThinkingSplitter) -> str:
    """The text that closes a reasoning cut by the thinking budget (on a line of its own)."""
    return "</think>\n\n" if splitter.reasoning_text.endswith("\n") else "\n</think>\n\n"


def _close_reasoning(run: _Stream) -> list[int]:
    """The thinking budget is spent: write the closing tag into the text; return its tokens, to feed next."""
    run.budget_hit = True
    close_text = close_text_for(run.splitter)
    deliver(run.emit, run.splitter.feed(close_text))
    tokens = list(run.model.tokenizer.encode(close_text, add_special_tokens=False))
    run.forced += len(tokens)
    return tokens


def _finish(run: _Stream, thinking: bool, finish: str) -> StreamedReply:
    splitter = run.splitter
    deliver(run.emit, splitter.flush())
    stats = with_mtp(
        run.clock.stats(
            last_token_at=run.last_token_at,
            now=time.perf_counter(),
            generated=len(run.generated),
            reasoning=run.reasoning,
            forced=run.forced,
            context=run.cached + len(run.added),
            finish=finish,
        ),
        run.mtp,
    )
    reply = Reply(
        text=splitter.answer_text,
        reasoning=splitter.reasoning_text,
        thinking=thinking,
        finish_reason=finish,
        stats=stats,
        budget_hit=run.budget_hit,
        token_ids=run.generated,
    )
    return StreamedReply(reply, splitter.in_reasoning, run.added)
