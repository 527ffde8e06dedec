"""A sequence's reply, token by token: the one bookkeeping of every reply, alone or in the batch.

`SequenceReply.take(token, finish)` is called once per sampled token, by the lone executor (solo.py) and by the batch
loop (batch.py) alike, and says what must happen next to the sequence (go on, end it, or feed the tokens that close
its reasoning). It turns tokens into the engine's events: the text split into reasoning and answer as it comes, the
first token's time, statistics at most every STATS_INTERVAL_S, the thinking budget (after N reasoning tokens
``</think>`` is fed and the model answers), a stop asked from another thread, the context cap; `finish()` returns
the StreamedReply (the Reply, whether it ended inside its reasoning, every token it put in the cache).

Text: a streaming detokenizer of the sequence's own (mlx-lm's `tokenizer.detokenizer` is a copy per caller); an
end-of-turn token is not written out, as mlx-lm's stream_generate does not. Also here: which MTP policy a lone
sequence drafts with (pick_policy, head_context).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import mtp_decode
from macapp.core.engine.clock import STATS_INTERVAL_S, TurnClock
from macapp.core.engine.mtp_policy import DepthPolicy, MTPCounts
from macapp.core.engine.options import KVQuantization, MTPMode
from macapp.core.events import AnswerDelta, Event, GenerationStats, PromptProgress, ReasoningDelta, Reply, StatsUpdate
from macapp.core.sampling import SamplingParams
from macapp.core.thinking import ANSWER, ThinkingSplitter

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel, Tokenizer
    from macapp.core.engine.mtp_context import HeadContext
    from macapp.core.engine.prompt_cache import PromptCache

Emit = Callable[[Event], None]


class StreamedReply(NamedTuple):
    reply: Reply
    still_reasoning: bool  # the reply ended inside its reasoning: whoever continues must close it first
    tokens_added: list[int]  # every token this stream put in the cache, in order (segment, forced, sampled)


def deliver(emit: Emit, pieces: list[tuple[str, str]]) -> None:
    for kind, piece in pieces:
        emit(AnswerDelta(piece) if kind == ANSWER else ReasoningDelta(piece))


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


def close_text_for(splitter: ThinkingSplitter) -> str:
    """The text that closes a reasoning cut by the thinking budget (on a line of its own)."""
    return "</think>\n\n" if splitter.reasoning_text.endswith("\n") else "\n</think>\n\n"


class Next(enum.Enum):
    GO_ON = "go_on"
    END = "end"  # remove the sequence from the batch: the reply is over (finish() tells how)
    CLOSE_REASONING = "close_reasoning"  # remove it and insert it again with `SequenceReply.segment` to read first


@dataclass(frozen=True)
class Limits:
    cached: int  # tokens in the cache before the reply's first fed token
    limit: int  # the context limit


class SequenceReply:
    """The reply of one sequence, token by token (see the module docstring). Worker thread only."""

    def __init__(
        self,
        model: "LoadedModel",
        *,
        limits: Limits,
        segment: list[int],
        params: SamplingParams,
        thinking: bool,
        budget: int | None,
        should_stop: Callable[[], bool],
        emit: Emit,
        clock: TurnClock,
    ):
        self.model, self.params, self.thinking, self.budget = model, params, thinking, budget
        self.should_stop, self.emit, self.clock = should_stop, emit, clock
        self.cached, self.limit = limits.cached, limits.limit
        self.splitter = ThinkingSplitter(in_reasoning=thinking and budget != 0)
        self.detokenizer = model.tokenizer.detokenizer
        self.eos = set(model.tokenizer.eos_token_ids)
        self.generated: list[int] = []  # sampled tokens (the reply's token_ids)
        self.added: list[int] = list(segment)  # every token this reply put in the cache: fed, then sampled, in order
        self.stream_start = 0  # where the current detokenizer's tokens start in `generated`
        self.reasoning = 0
        self.forced = 0
        self.budget_hit = False
        self.last_token_at = 0.0
        self.next_stats = 0.0
        self.lead = True  # no text out of this detokenizer yet (reply.leading_space)
        self.segment: list[int] = []  # tokens to feed when take() says CLOSE_REASONING
        self.finish_reason = "length"
        self.mtp = MTPCounts()  # what the MTP head did while the sequence ran alone (solo.py)

    @property
    def started(self) -> bool:
        return bool(self.generated)

    def max_tokens(self) -> int:
        """How many tokens the batch may still sample for it: max_tokens left, within the context's room."""
        room = self.limit - self.cached - len(self.added)
        return min(self.params.max_tokens - len(self.generated), room)

    def no_room(self) -> None:
        """Not even the first token fits in the context: nothing is fed, and the reply ends empty."""
        self.added.clear()
        self.finish_reason = "context"

    def take(self, token: int, finish: str | None) -> Next:
        """The batch sampled `token` (its finish reason: 'stop' for an end-of-turn token, 'length' for the last
        token max_tokens allowed). Emits its text and statistics; says what to do next."""
        now = time.perf_counter()
        clock = self.clock
        if not clock.first_token_at:
            clock.first_token(now)
            self.emit(PromptProgress(clock.prompt_tokens, clock.prompt_tokens))
        self.last_token_at = now
        self.generated.append(token)
        self.added.append(token)
        if self.splitter.in_reasoning:
            self.reasoning += 1
        if token not in self.eos:
            self.detokenizer.add_token(token)
            self._text(self.detokenizer.last_segment)
        if finish is not None:
            self.finish_reason = self._capped(finish)
            return Next.END
        if self.should_stop():
            self.finish_reason = "stopped"
            return Next.END
        if self.budget is not None and self.reasoning >= self.budget and self.splitter.in_reasoning:
            return self._over_budget()
        if self.max_tokens() <= 0:  # only the context's room can end it here (max_tokens ends with finish 'length')
            self.finish_reason = "context"
            return Next.END
        if now >= self.next_stats:
            self.next_stats = now + STATS_INTERVAL_S
            self.emit(StatsUpdate(self._stats(now, None)))
        return Next.GO_ON

    def _capped(self, finish: str) -> str:
        if finish == "length" and self.params.max_tokens - len(self.generated) > 0:
            return "context"  # the context limit, not max_tokens, ended the reply
        return finish

    def _over_budget(self) -> Next:
        """The thinking budget is spent: feed the closing tag unless no token is left."""
        if self.params.max_tokens - len(self.generated) <= 0:
            self.finish_reason = "length"
            return Next.END
        self._text(self._flush_detokenizer())
        self.budget_hit = True
        close = close_text_for(self.splitter)
        deliver(self.emit, self.splitter.feed(close))
        self.segment = list(self.model.tokenizer.encode(close, add_special_tokens=False))
        self.forced += len(self.segment)
        self.added.extend(self.segment)
        self.detokenizer = self.model.tokenizer.detokenizer  # the closing tag is written; go on from after it
        self.stream_start = len(self.generated)
        self.lead = True
        if self.max_tokens() <= 0:
            self.finish_reason = "context"
            return Next.END
        return Next.CLOSE_REASONING

    def _flush_detokenizer(self) -> str:
        self.detokenizer.finalize()
        segment: str = self.detokenizer.last_segment
        return segment

    def _text(self, text: str) -> None:
        if not text:
            return
        if self.lead:
            self.lead = False
            text = leading_space(self.model.tokenizer, self.generated[self.stream_start :], text)
        deliver(self.emit, self.splitter.feed(text))

    def _stats(self, now: float, finish: str | None) -> GenerationStats:
        stats = self.clock.stats(
            last_token_at=self.last_token_at or now,
            now=now,
            generated=len(self.generated),
            reasoning=self.reasoning,
            forced=self.forced,
            context=self.cached + len(self.added),
            finish=finish,
        )
        return with_mtp(stats, self.mtp)

    def finish(self) -> StreamedReply:
        """The reply, once take() said END."""
        self._text(self._flush_detokenizer())
        deliver(self.emit, self.splitter.flush())
        stats = self._stats(time.perf_counter(), self.finish_reason)
        reply = Reply(
            text=self.splitter.answer_text,
            reasoning=self.splitter.reasoning_text,
            thinking=self.thinking,
            finish_reason=self.finish_reason,
            stats=stats,
            budget_hit=self.budget_hit,
            token_ids=self.generated,
        )
        return StreamedReply(reply, self.splitter.in_reasoning, self.added)
