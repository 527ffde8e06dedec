"""The MTP head's own context: its KV cache over a sequence's tokens, kept beside the sequence's prompt cache.

mlx-vlm's drafter keeps one KV cache inside the drafter object (one per loaded model) and fills it from the
target's hidden states (`prefill_from_target_hidden`) before its first draft. Here each sequence's head context
lives with its prompt cache (PromptCache.head) and goes where it goes: from chat turn to turn, through marks and
rewinds, into the API pool's checkpoints and out of them. A stream lends it to the drafter (`lend`), whose rounds
then append to it in place (draft_block, accept_verified_tokens).

The head's entry at position i is made of the target's post-norm hidden state of token i and the embedding of
token i+1 (mlx-vlm's shift). So once the model has read tokens 0..n-1 the entries can reach position n-2, and
`carry` keeps hidden(n-1) for the pairing with token n. Entries run without a hole from `base`: tokens read
without their hidden states (by the batch, by mlx-lm's generate_step once "auto" handed over, with pictures)
leave a gap, and the next read starts the context again after it. What the context holds changes only how
many drafts the head gets right, never the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from macapp.core.engine.positions import HeadLayer, HeadPart, HeadPlace

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_vlm.models.cache import KVCache  # the drafter's own cache layers (mlx-vlm's, not mlx-lm's)

    from macapp.core.engine.mtp_head import MTPHead
    from macapp.core.engine.positions import SavedPosition


@dataclass
class HeadContext:
    """The head's KV cache over a sequence (see the module docstring). Worker thread only."""

    head: MTPHead
    layers: list[KVCache]
    base: int = 0  # the position of the first entry
    carry: tuple[int, mx.array] | None = None  # (position, hidden (1, 1, H)) of the last token read, not yet paired
    kept: dict[int, mx.array] = field(default_factory=dict)  # hidden states at marked points, for rewinds

    @classmethod
    def new(cls, head: MTPHead, base: int = 0) -> HeadContext:
        return cls(head, head.drafter.make_cache(), base)

    @property
    def end(self) -> int:
        """The position of the next entry."""
        return self.base + self.layers[0].offset

    def read(self, first: int, tokens: Sequence[int], hidden: mx.array) -> None:
        """The model read `tokens` at positions first, first+1, ... and gave `hidden` (1, n, H) for them."""
        import mlx.core as mx

        n = len(tokens)
        if n == 0:
            return
        carried = self.carry[1] if self.carry is not None and self.carry[0] == first - 1 else None
        end = self.end
        if end < first - 1 or (end == first - 1 and carried is None):  # a gap: start again after it
            self._restart(first)
            pairs, states = list(tokens[1:]), hidden[:, :-1, :]
        elif end == first - 1:
            assert carried is not None
            pairs, states = list(tokens), mx.concatenate([carried, hidden[:, :-1, :]], axis=1)
        else:  # the entries of the first `skip` tokens are there already (a round paired its last token)
            skip = min(end - first + 1, n)
            pairs, states = list(tokens[skip:]), hidden[:, skip - 1 : -1, :]
        if pairs:
            self._append(pairs, states)
        last = mx.array(hidden[:, -1:, :])  # a copy: a slice would keep the whole chunk's hidden states alive
        mx.eval(last)
        self.carry = (first + n - 1, last)

    def lend(self) -> None:
        """Make this context the drafter's cache for the rounds that follow (its first draft pairs the given token
        with the hidden state before it, at `end`)."""
        drafter = self.head.drafter
        own = drafter.reset(self.head.target)
        drafter.set_shared_kv({}, self.end)  # the drafter's own list is empty here, so this sets its next position
        own[:] = self.layers  # mlx-vlm keeps the list it returned as its cache: its rounds now write into ours

    def align(self, length: int) -> None:
        """Before the first round over a prompt cache of `length` tokens: the entries reach position length-2 (the
        round pairs the given token with hidden(length-1) at length-1), or the context starts again there."""
        if self.end > length - 1:
            self.trim_to(length)
        if self.end != length - 1:
            self._restart(length - 1)

    def remember(self) -> None:
        """A mark is taken here: keep the carried hidden state, so a rewind to this point can go on pairing."""
        if self.carry is not None:
            self.kept[self.carry[0] + 1] = self.carry[1]

    def inherit_marks(self, other: HeadContext) -> None:
        """This context went on from a copy of `other` (the same tokens up to where it branched): keep the hidden
        states `other` kept at its marks, so a rewind to one of them goes on pairing here too."""
        self.kept = {**other.kept, **self.kept}

    def keep_mark(self, position: SavedPosition) -> None:
        """A mark of this sequence was taken where `position` was (on another copy of its cache): remember."""
        if position.head is not None and position.head.carry is not None:
            carry = position.head.carry
            self.kept.setdefault(carry[0] + 1, carry[1])

    def trim_to(self, length: int) -> None:
        """The prompt cache holds `length` tokens now (a settled stream, a rewind): drop the entries after them."""
        keep = length - 1 - self.base
        if keep < 0:
            self._restart(length)
        else:
            for layer in self.layers:
                layer.trim(layer.offset - min(keep, layer.offset))
        hidden = self.kept.get(length)
        if hidden is not None:
            self.carry = (length - 1, hidden)
        elif self.carry is not None and self.carry[0] != length - 1:
            self.carry = None
        self.kept = {at: h for at, h in self.kept.items() if at <= length}

    def saved(self, length: int) -> HeadPart:
        """The context as a saved position of a prompt cache holding `length` tokens keeps it (positions.save):
        views of its keys and values, no copy."""
        held = max(0, min(self.end, length - 1) - self.base)
        layers = tuple(
            HeadLayer(layer.keys[..., :held, :], layer.values[..., :held, :])
            if held and layer.keys is not None and layer.values is not None
            else HeadLayer(None, None)
            for layer in self.layers
        )
        carry = self.carry if self.carry is not None and self.carry[0] == length - 1 else None
        return HeadPlace(self.base, carry), layers

    @classmethod
    def restore(cls, head: MTPHead, part: HeadPart) -> HeadContext:
        """A fresh context at a saved position's `part` (reading on never writes into the position's arrays)."""
        place, layers = part
        context = cls.new(head, place.base)
        for layer, kept in zip(context.layers, layers, strict=True):
            if kept.keys is not None and kept.values is not None:
                layer.keys, layer.values, layer.offset = kept.keys[..., :, :], kept.values[..., :, :], kept.keys.shape[2]
        context.carry = place.carry
        return context

    def _restart(self, base: int) -> None:
        self.layers = self.head.drafter.make_cache()
        self.base, self.carry, self.kept = base, None, {}

    def _append(self, tokens: list[int], hidden: mx.array) -> None:
        """Add the entries of `tokens` (each with the hidden state before it) at `end`."""
        import mlx.core as mx

        # mlx-vlm has no public call that extends the drafter's cache at a position other than 0; its
        # accept_verified_tokens does exactly this for verified tokens (each with the hidden state before it)
        self.lend()
        drafts = mx.array([tokens[:-1]], dtype=mx.int32)
        self.head.drafter.accept_verified_tokens(hidden, drafts, len(tokens) - 1, [tokens[-1]], None, greedy=True)
        mx.eval([layer.state for layer in self.layers])
