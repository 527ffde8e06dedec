"""Speculative decoding with the model's own MTP head on Qwen3.5's hybrid cache, for a lone sequence (solo.py).

The cache contract is plain decoding's: once settled, the cache holds exactly the tokens handed out, in order, as
after mlx-lm's generate_step (which feeds each token before yielding it).

A round: the head drafts k tokens after the last one `b` (not yet read into the cache); the model reads
[b, *drafts] in one verify pass; the acceptance walk (mtp_accept) keeps the first `a` drafts and gives the
model's own next token. Rejected drafts must leave no trace. The KV layers could be trimmed, but mlx-lm's
Gated DeltaNet layers fold every token into their conv and recurrent state (an ArraysCache), which cannot be
rewound. So the round takes a mark first (positions.mark: references to the DeltaNet arrays, nothing
copied), and when a draft was rejected it restores it and re-reads [b, *kept] (one more pass). When every draft
was kept the verify pass is already the commit. A stop in the middle of a round's tokens settles the cache
the same way (restore, re-read what was given out).

Built on mlx-vlm's Qwen3.5 MTP drafter (its module, draft_block, accept_verified_tokens: it keeps the head's
own KV cache and seeds the next round). What was needed beyond it: the head's loading (mtp_head.py); the
target's post-norm hidden states from mlx-lm's model (mlx-vlm's path asks its own model for them); rollback of
mlx-lm's ArraysCache by snapshot and re-read (mlx-vlm relies on its own DeltaNet kernel's per-step states);
the acceptance rule on our sampler and logits processors; the stop/eos/max_tokens cache contract above; the
measured depth and "auto" (mtp_policy.py), handing back to plain decoding when MTP does not pay.
The head's own cache (mtp_context.HeadContext) is the sequence's, kept with its prompt cache: fed each prompt
chunk's hidden states as the prompt is read (prefill.py, solo.py; mlx-vlm's `prefill_from_target_hidden` does this
once for a whole prompt), lent to the drafter for the rounds, and settled with the cache. Without one (a caller
that keeps none) the head starts empty at each stream and sees only its tokens: only acceptance depends on it.

`Decoder` gives one round at a time (`start`, `round`, `gave`, `settle`), so a lone sequence of the batch
(solo.py) hands each token to its reply itself and looks for another arrival between rounds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.mtp_accept import Acceptor
from macapp.core.engine.mtp_policy import DepthPolicy, MTPCounts
from macapp.core.engine.positions import ObservedCache, SavedPosition, mark, rewind
from macapp.core.sampling import SamplingParams

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.mtp_context import HeadContext
    from macapp.core.engine.mtp_head import MTPHead


def usable(m: "LoadedModel", head: "MTPHead | None", cache: CacheLayers, kv_bits: int | None) -> bool:
    """Whether this stream can draft with `head`: the head belongs to this very model object (not the pictures'
    positioned model, not a cluster's shard), the KV cache is not quantized, and no mirror repeats the cache."""
    if head is None or head.target is not m.model or kv_bits is not None:
        return False
    return not (isinstance(cache, ObservedCache) and cache.mirror is not None)


class Decoder:
    """One stream's rounds. `fed` / `given` are the tokens read into the cache and handed out since `base`
    (a snapshot, or None when nothing read since needs undoing): settle() makes the first equal the second."""

    def __init__(
        self,
        m: "LoadedModel",
        head: "MTPHead",
        cache: CacheLayers,
        cached: int,
        params: SamplingParams,
        sampler: "Sampler",
        processors: list["LogitsProcessor"],
        policy: DepthPolicy,
        counts: MTPCounts,
        history: list[int] | None = None,
        context: "HeadContext | None" = None,
    ):
        self.m, self.head, self.cache, self.length = m, head, cache, cached
        self.context = context
        self.lm = m.model.language_model
        self.sampler, self.processors, self.policy, self.counts = sampler, processors, policy, counts
        # what the logits processors have seen: generate_step's `tokens` (this stream's), or the batch's (every
        # token the cache holds) when a lone sequence of the batch drafts (solo.py)
        self.history: list[int] = list(history or [])
        self.acceptor = Acceptor(params, processors, self.history)
        self.base: SavedPosition | None = None
        self.fed: list[int] = []
        self.given: list[int] = []
        self.last_hidden: mx.array | None = None  # the target's hidden state before the last given token
        self.live = False  # the head's own cache follows this stream's tokens

    # -- the model -------------------------------------------------------------------------------------
    def _forward(self, tokens: list[int]) -> tuple[mx.array, mx.array]:
        """Read `tokens` into the cache: (post-norm hidden states (1, n, H), logits (n, V))."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            hidden = self.lm.model(mx.array(tokens)[None], cache=self.cache)
            if self.lm.args.tie_word_embeddings:
                logits = self.lm.model.embed_tokens.as_linear(hidden)
            else:
                logits = self.lm.lm_head(hidden)
        self.length += len(tokens)
        self.counts.passes += 1
        return hidden, logits[0]

    def _read(self, tokens: list[int], *, in_round: bool = False) -> None:
        """Read `tokens` into the cache; the head's context hears of them unless the round's drafter keeps it."""
        import mlx.core as mx

        if tokens:
            first = self.length
            hidden, _ = self._forward(tokens)
            mx.eval(hidden, [c.state for c in self.cache])
            if not in_round:
                self._tell_context(first, tokens, hidden)

    def _tell_context(self, first: int, tokens: list[int], hidden: mx.array) -> None:
        if self.context is not None:
            self.context.read(first, tokens, hidden)

    def start(self, segment: list[int]) -> int:
        """Read `segment`; the first token (the caller hands it on with `gave`, as a round's)."""
        start = time.perf_counter()
        first = self.length
        hidden, logits = self._forward(segment)
        self.history.extend(segment)
        token = self.acceptor.first(logits[-1])
        if self.policy.wants_plain_probe() and len(segment) == 1:  # a plain step's work: one token read
            self.policy.plain_step(time.perf_counter() - start)
        self._tell_context(first, segment, hidden)
        self.base, self.fed, self.given = None, [], []
        self.last_hidden = hidden[:, -1:, :]
        return token

    def round(self, most: int) -> list[int] | None:
        """One round after the last given token (a plain step at depth 0): the tokens it gives, at most `most`
        (at least 1). The caller hands each on with `gave` (a stop between them is settled). None: "auto" found MTP
        does not pay, plain decoding from here."""
        depth = self.policy.depth(most - 1)
        if depth == 0 and self.policy.off:
            return None
        b = self.given[-1]
        self.base, self.fed, self.given = None, [], [b]
        if depth == 0:
            token, self.last_hidden = self._plain_step(b)
            self.live = False
            return [token]
        assert self.last_hidden is not None, "start() reads the segment before the first round"
        if not self.live:
            self._go_live(b, self.last_hidden)
        given, self.last_hidden = self._round(b, self.last_hidden, depth)
        return given

    def _go_live(self, b: int, last_hidden: mx.array) -> None:
        """Before a first round (or the first after plain steps): the drafter's cache is the context's (or a new one),
        and the pair (b, hidden before b) is read into it as a verified token, which seeds the round's first draft.
        Read by draft_block instead, the pair would count among the round's drafts, and accept_verified_tokens
        would keep one draft too few and write the model's own next token one position early."""
        import mlx.core as mx

        drafter = self.head.drafter
        if self.context is not None:
            self.context.align(self.length)
            self.context.lend()
        else:
            drafter.reset(self.m.model)
            drafter.set_shared_kv({}, self.length - 1)  # the pair (b, hidden before b) sits there
        drafter.accept_verified_tokens(last_hidden, mx.zeros((1, 0), dtype=mx.int32), 0, [b], None, greedy=True)
        self.live = True

    def gave(self, token: int) -> None:
        """`token` of the round was handed on."""
        self.given.append(token)

    def _plain_step(self, b: int) -> tuple[int, mx.array]:
        start = time.perf_counter()
        hidden, logits = self._forward([b])
        self.fed = [b]
        self.history.append(b)
        token = self.acceptor.first(logits[-1])
        self.policy.plain_step(time.perf_counter() - start)
        self._tell_context(self.length - 1, [b], hidden)  # after the measurement: feeding the head is MTP's cost
        return token, hidden

    def _round(self, b: int, last_hidden: mx.array, depth: int) -> tuple[list[int], mx.array]:
        """Draft `depth` tokens after `b`, verify, commit; the tokens the round gives and the hidden after them."""
        import mlx.core as mx

        drafter = self.head.drafter
        t0 = time.perf_counter()
        draft_array = drafter.draft_block(b, last_hidden, None, depth + 1, None, greedy=True)
        drafts = [int(t) for t in cast("list[int]", draft_array[0].tolist())]  # a row of token ids
        t1 = time.perf_counter()
        self.base = mark(self.cache, self.length)
        hidden, logits = self._forward([b, *drafts])
        self.history.append(b)
        verdict = self.acceptor.walk(logits, drafts)
        t2 = time.perf_counter()
        kept = drafts[: verdict.accepted]
        reread = None
        if verdict.accepted < depth:  # a rejected draft: back to before the pass, then read what was kept
            self._restore()
            self._read([b, *kept], in_round=True)
            reread = time.perf_counter() - t2
        self.fed = [b, *kept]
        self.history.extend(kept)
        t3 = time.perf_counter()
        drafter.accept_verified_tokens(hidden, draft_array, verdict.accepted, [*kept, verdict.token], None, greedy=True)
        mx.eval(drafter.draft_eval_state())
        head_s = (t1 - t0) + (time.perf_counter() - t3)
        looked = min(verdict.accepted + 1, depth)
        self.policy.round(depth=depth, looked=looked, kept=verdict.accepted, draft_s=head_s, verify_s=t2 - t1, reread_s=reread)
        counts = self.counts
        counts.steps += 1
        counts.drafted += looked
        counts.accepted += verdict.accepted
        counts.tokens += verdict.accepted + 1
        last_hidden = hidden[:, verdict.accepted : verdict.accepted + 1, :]
        if self.context is not None:  # the drafter wrote the round's entries into it (lend); the last token's hidden
            self.context.carry = (self.length - 1, last_hidden)
        return [*kept, verdict.token], last_hidden

    def _restore(self) -> None:
        assert self.base is not None, "nothing read since the last settled point needs undoing"
        rewind(self.cache, self.base)
        self.length = self.base.length

    def settle(self, last_unread: bool = False) -> None:
        """The cache holds exactly what was handed out (see the class docstring); `last_unread`: all but the last
        given token (a lone sequence hands that one to the batch to read: solo.py)."""
        fed = self.fed
        want = self.given[:-1] if last_unread else self.given
        if want[: len(fed)] == fed:
            self._read(want[len(fed) :])
        else:
            self._restore()
            self._read(want)
        self.fed = list(want)
        if self.context is not None:  # a round's entries for tokens not held (a stop mid-round, the last unread)
            self.context.trim_to(self.length)
