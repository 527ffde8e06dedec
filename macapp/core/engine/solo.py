"""A sequence alone: read and decoded outside mlx-lm's batch until another arrives (used by batch.py).

mlx-lm's GenerationBatch pays per step for what only a batch needs (left-padding masks and offsets in every
layer, per-sequence splits of the logits): alone, a sequence decoded 0.91x as fast through it as through the
one-at-a-time path (bench/batch_solo.py). So while the batch is empty the loop runs its one sequence here, on a
copy of its cache, with its own sampler and logits processors, pipelined as mlx-lm's generate_step is (the next
token is computed while this one is handed on). When another sequence arrives, `run` stops at a token (or chunk)
boundary and returns a HandOver: the cache, the tokens it holds and what is still to read, which is exactly what
`BatchGenerator.insert_segments` takes, so the sequence goes on in the batch where it stopped here.

Token for token this is the batch's own bookkeeping: the reply's `take` sees each token after it was fed, as in
GenerationBatch; "stop" is an end-of-turn token, "length" the last token `max_tokens()` allowed.

Alone, a sequence drafts with the build's MTP head when its mode allows (`Sequence.mtp`, reply.pick_policy):
mtp_decode's rounds, each round's tokens handed to `take` one at a time in order. A stop, the end or the
thinking budget mid-round settles the cache to the tokens taken (mtp_decode's snapshot and re-read); another
sequence arriving is looked at between rounds: the round's tokens all taken, the cache settled to all but the
last, which the batch reads as a plain step would. In the batch (more than one sequence) there is no MTP.

When the others end and one sequence is left mid-reply, the batch hands it back here (`go_on`): its cache (a
copy, mlx-lm's `extract`) and the token the generator sampled for it but has not read, so it decodes alone again
and drafts again, as a request arriving at an empty batch would (the head's context starts again there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, cast

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.reply import Next
from macapp.core.engine.mtp_decode import Decoder
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.positions import SavedPosition, mark, save
from macapp.core.engine.prefill import prefill, wired_memory
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.engine.reply import StreamedReply, drafting, head_context, pick_policy
from macapp.core.upstream import quantized_layers
from macapp.core.events import PromptProgress

if TYPE_CHECKING:
    import mlx.core as mx

    from macapp.core.engine.sequence import Sequence
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.mtp_context import HeadContext
    from macapp.core.engine.mtp_head import MTPHead


@dataclass
class HandOver:
    """Where a sequence stopped here, for the batch: `layers` hold `tokens`; `segments` are still to read."""

    layers: CacheLayers
    tokens: list[int]
    segments: list[list[int]]


@dataclass
class Ended:
    """The sequence ended here (its reply finished, or it was stopped while reading: `reply_done` False)."""

    layers: CacheLayers
    reply_done: bool
    head: HeadContext | None = None  # the MTP head's context over `layers` when the sequence read with it


class SoloRun:
    """One sequence's reading and decoding on its own (worker thread only; see the module docstring)."""

    def __init__(self, m: "LoadedModel", seq: "Sequence", at: HandOver | None = None):
        """`at`: where the batch left the sequence (its own copy of the cache; go_on decodes on from there)."""
        from mlx_lm.models.cache import TokenBuffer

        self.m, self.seq, self.prefill_step = seq.runs_on or m, seq, seq.prefill_step
        own = PromptCache(at.layers, list(at.tokens)) if at is not None else seq.prompt  # read in place
        self.layers = own.layers
        self.quantize = seq.kv.bits is not None  # until done: once the cache holds --quantized-kv-start tokens
        # what the logits processors see (a picture's tokens are held as its digest: its image token stands for it)
        pad = int(cast(int, m.config.get("image_token_id", 0)))
        self.tokens: list[int] = [t if isinstance(t, int) else pad for t in own.tokens]
        self.segments = [list(s) for s in (at.segments if at is not None else seq.segments)]
        self.context = TokenBuffer(self.tokens) if seq.processors else None
        self.eos = set(m.tokenizer.eos_token_ids)
        self.steps = 0  # forward passes
        self._quantize_at(len(self.tokens))
        self.policy = pick_policy(self.m, self.layers, seq.kv, seq.mtp, seq.mtp_policy)  # no MTP on a quantized cache
        # the MTP head's context (mtp_context.py), fed as the prompt is read, when this sequence drafts
        self.head = head_context(self.m, own, self.policy)

    def run(self, someone_waits: Callable[[], bool]) -> HandOver | Ended:
        """Read the prompt, then decode, until the reply ends or `someone_waits()` (asked at every boundary)."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        seq = self.seq
        segments = self.segments
        with mx.stream(generation_stream):
            while True:
                handed = self._read(segments, someone_waits)
                if handed is not None:
                    return handed
                if seq.job.stopped and not seq.reply.started:
                    return Ended(self.layers, reply_done=False)
                if not seq.reply.started:
                    if seq.reply.max_tokens() <= 0:
                        seq.reply.no_room()
                        return Ended(self.layers, reply_done=True, head=self.head)
                    seq.read += len(segments[-1])
                last = segments.pop()  # the last segment: its logits give the first token
                policy, head = self.policy, self.m.mtp_head
                if policy is not None and head is not None and drafting(policy):
                    outcome = self._decode_drafting(head, policy, last, someone_waits)
                else:
                    outcome = self._decode(self._feed(last), someone_waits)
                if isinstance(outcome, (HandOver, Ended)):
                    return outcome
                segments = [outcome]  # the thinking budget's closing tag, to read before sampling on

    def go_on(self, token: int, someone_waits: Callable[[], bool]) -> HandOver | Ended:
        """Decode on from where the batch left the sequence (`at`): `token` is the one it sampled and has not read,
        handed to the reply here as the batch's next step would have."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        match self.seq.reply.take(token, self._finish_of(token)):
            case Next.END:
                with mx.stream(generation_stream):
                    self._read_last(token)
                return Ended(self.layers, reply_done=True, head=self.head)
            case Next.CLOSE_REASONING:
                self.segments = [[token, *self.seq.reply.segment]]
            case Next.GO_ON:
                self.segments = [[token]]
        return self.run(someone_waits)

    def _read(self, segments: list[list[int]], someone_waits: Callable[[], bool]) -> HandOver | None:
        """Read every segment but the last, chunk by chunk (engine/prefill.py), telling `on_segment` of each boundary."""
        seq = self.seq
        while len(segments) > 1:
            if seq.job.stopped and not seq.reply.started:
                return None
            if someone_waits():
                return HandOver(self.layers, self.tokens, segments)
            segment = segments[0]
            chunk, rest = segment[: self.prefill_step], segment[self.prefill_step :]
            at = seq.read - seq.joined_at  # rows of `embeddings` read so far (pictures never join the batch)
            embeddings = None if seq.embeddings is None else seq.embeddings[at : at + len(chunk)]
            prefill(self.m, self.layers, chunk, step=len(chunk), embeddings=embeddings, head=self.head, held=len(self.tokens))
            self.steps += 1
            self._held(chunk)
            seq.read += len(chunk)
            if not seq.reply.started:
                seq.job.emit(PromptProgress(min(seq.read, seq.total), seq.total))
            if rest:
                segments[0] = rest
                continue
            segments.pop(0)
            at = len(self.tokens)
            if seq.on_segment is not None and at in seq.bounds:
                seq.on_segment(_HereEnd(self, at))
        return None

    def _feed(self, tokens: list[int]) -> mx.array:
        """Read `tokens` (the last one's logits are kept) and sample the next token, not yet read; lazily."""
        import mlx.core as mx

        for start in range(0, len(tokens) - 1, self.prefill_step):  # all but the last chunk, as prefill does
            chunk = tokens[start : min(start + self.prefill_step, len(tokens) - 1)]
            self.m.model(mx.array(chunk)[None], cache=self.layers)
            mx.eval([c.state for c in self.layers])
            self.steps += 1
            self._held(chunk)
        last = tokens[-1:]
        logits = self.m.model(mx.array(last)[None], cache=self.layers)[:, -1, :]
        self.steps += 1
        context = self._held(last)
        if context is not None:  # kept whenever the sequence has processors (__init__)
            for processor in self.seq.processors:
                logits = processor(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        y = self.seq.sampler(logprobs)
        mx.async_eval(y)
        return y

    def _decode(self, y: mx.array, someone_waits: Callable[[], bool]) -> HandOver | Ended | list[int]:
        """Decode from `y` (sampled, not read). Returns where it stopped, or the tokens to read next (the budget)."""
        reply = self.seq.reply
        while True:
            token = int(cast(int, y.item()))  # a token id (mlx types item() as any scalar)
            if someone_waits():
                return self._hand_over(token)
            finish = self._finish_of(token)
            if finish is None:
                y = self._feed([token])
            else:  # the reply ends with this token (take answers END)
                self._read_last(token)
            match reply.take(token, finish):
                case Next.GO_ON:
                    continue
                case Next.END:
                    return Ended(self.layers, reply_done=True, head=self.head)
                case Next.CLOSE_REASONING:
                    return list(reply.segment)

    def _decode_drafting(self, head: "MTPHead", policy: DepthPolicy, segment: list[int], someone_waits: Callable[[], bool]) -> HandOver | Ended | list[int]:
        """Read `segment` and decode with the MTP head (see the module docstring). Returns where it stopped, or the
        tokens to read next: the budget's closing tag, or the last token when "auto" turned MTP off."""
        seq, reply = self.seq, self.seq.reply
        counts = reply.mtp
        passes = counts.passes
        rounds = Decoder(
            self.m,
            head,
            self.layers,
            len(self.tokens),
            reply.params,
            seq.sampler,
            seq.processors,
            policy,
            counts,
            history=self.tokens if seq.processors else None,  # the processors see every token held, as in the batch
            context=self.head,
        )
        taken: list[int] = []

        def settled(last_unread: bool = False) -> None:
            rounds.settle(last_unread)
            self.steps += counts.passes - passes
            self._held([*segment, *(taken[:-1] if last_unread else taken)])

        given: list[int] | None = [rounds.start(segment)]
        while given is not None:
            for token in given:
                rounds.gave(token)
                taken.append(token)
                match reply.take(token, self._finish_of(token)):
                    case Next.GO_ON:
                        continue
                    case Next.END:
                        settled()
                        return Ended(self.layers, reply_done=True, head=self.head)
                    case Next.CLOSE_REASONING:
                        settled()
                        return list(reply.segment)
            if someone_waits():
                settled(last_unread=True)
                return HandOver(self.layers, self.tokens, [[taken[-1]]])
            given = rounds.round(reply.max_tokens())
        settled(last_unread=True)  # "auto": MTP does not pay here; plain decoding from the last token
        return [taken[-1]]

    def _hand_over(self, token: int) -> HandOver | Ended:
        """Another sequence arrived: `token` was sampled but is not read yet; the batch reads it (or the reply ends)."""
        match self.seq.reply.take(token, self._finish_of(token)):
            case Next.GO_ON:
                return HandOver(self.layers, self.tokens, [[token]])
            case Next.CLOSE_REASONING:
                return HandOver(self.layers, self.tokens, [[token, *self.seq.reply.segment]])
            case Next.END:
                self._read_last(token)  # the cache holds the reply's last token, as the batch's does
                return Ended(self.layers, reply_done=True, head=self.head)

    def _read_last(self, token: int) -> None:
        import mlx.core as mx

        self.m.model(mx.array([token])[None], cache=self.layers)
        mx.eval([c.state for c in self.layers])
        self.steps += 1
        self._held([token])

    def _finish_of(self, token: int) -> str | None:
        if token in self.eos:
            return "stop"
        if self.seq.reply.max_tokens() <= 1:  # the last token it may sample
            return "length"
        return None

    def _quantize_at(self, held: int) -> None:
        """Quantize the KV layers once they hold the sequence's `start` tokens, as the batch's are (upstream.py), so
        alone and beside others read the same; in place, so a mirrored cache stays one list."""
        if self.quantize and held >= self.seq.kv.start:
            self.layers[:] = quantized_layers(self.layers, self.seq.kv)
            self.quantize = False

    def _held(self, tokens: list[int]) -> mx.array | None:
        """`tokens` were read into the layers; returns every token they hold, as the logits processors see them."""
        import mlx.core as mx

        self.tokens.extend(tokens)
        self._quantize_at(len(self.tokens))
        if self.context is None:
            return None
        held: mx.array = self.context.update_and_fetch(mx.array(tokens, dtype=mx.int32))
        return held


class _HereEnd:
    """A segment's end in a lone sequence's own cache, where it is now (sequence.SegmentEnd)."""

    def __init__(self, run: SoloRun, at: int):
        self.run, self.length = run, at

    def mark(self) -> SavedPosition:
        if self.run.head is not None:
            self.run.head.remember()
        return mark(self.run.layers, self.length)

    def save(self) -> SavedPosition:
        run, at = self.run, self.length
        spans = [span.until(at) for span in run.seq.prompt.spans if span.start < at]
        return save(run.layers, run.seq.tokens_until(at), spans, run.head.saved(at) if run.head is not None else None)


def run_alone(m: "LoadedModel", seq: "Sequence") -> StreamedReply | None:
    """Run `seq` alone to its end, now, on this thread (the worker: inside Engine.submit work), as the batch loop
    runs a sequence that cannot share the batch; for engine extensions and measurements. The reply (None: stopped
    while reading); the sequence's cache then holds what it read and wrote (`seq.prompt`'s layers)."""
    solo = SoloRun(m, seq)
    with wired_memory(m):
        outcome = solo.run(lambda: False)
    if isinstance(outcome, Ended) and outcome.reply_done:
        return seq.reply.finish()
    return None
