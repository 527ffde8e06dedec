"""One sequence's prompt cache and what it holds: the one owner a chat session, the API's pool and the batch share.

    prompt = PromptCache.new(model)              # or PromptCache.restore(position)
    prompt.extend(tokens)                        # after reading them into prompt.layers (prefill, the batch)
    mark = prompt.mark()                         # a point to come back to (regenerate / edit)
    prompt.rewind(mark)                          # back there: layers, tokens and pictures after it forgotten
    position = prompt.save()                     # detached: for the API's pool (serving/pool.py), the disk

Marks and saved positions are one type, SavedPosition (positions.py). `layers` is mlx-lm's list of layer caches
(an ObservedCache on several Macs, whose one `mirror` hears of every position taken, rewound to or restored:
positions.py); `tokens` the tokens they hold, in order (the
pool's key: a picture's image tokens may be its digest); `spans` the pictures among them with their mRoPE
positions (macapp.core.vision.spans.PictureSpan), so a rewind forgets the pictures after the point it goes back
to, and a saved position keeps those before it: restored, the cache has them again and reading on from it gives the
positions a fresh read gives (the one record of picture positions, for a chat session and the API alike);
`head` the MTP head's own context over the same tokens (mtp_context.py), where a stream drafts: marks, rewinds
and saved positions carry it along (a saved position keeps its layers after the model's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine import positions
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.positions import HeadPart, SavedPosition

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.mtp_head import MTPHead
    from macapp.core.vision.spans import PictureSpan


class PromptCache:
    """A sequence's cache layers, the tokens they hold and the pictures among them (see the module docstring)."""

    def __init__(
        self,
        layers: CacheLayers,
        tokens: Sequence[Any] = (),
        spans: list[PictureSpan] | None = None,
        head: HeadContext | None = None,
        kept_head: HeadPart | None = None,
    ):
        self.layers = layers
        self.tokens: list[Any] = list(tokens)
        self.spans: list[PictureSpan] = spans if spans is not None else []  # vision.spans' PictureSpans, by start
        self.head = head
        self._kept_head = kept_head  # the head's context a saved position kept, until a stream asks for it

    @classmethod
    def new(cls, model: "LoadedModel") -> "PromptCache":
        """An empty cache for `model` (mlx-lm's make_prompt_cache: the model's own make_cache where it has one)."""
        from mlx_lm.models.cache import make_prompt_cache

        return cls(make_prompt_cache(model.model))

    @classmethod
    def restore(cls, position: SavedPosition) -> "PromptCache":
        """A fresh cache at a detached `position`: reading on into it never touches the position (nor its MTP head
        context, which comes back when a stream asks for it: head_context)."""
        return cls(positions.restore(position), position.tokens, list(position.spans), kept_head=position.head_part)

    def head_context(self, head: "MTPHead") -> HeadContext:
        """The MTP head's context over this cache: the one it has, or the one its saved position kept, or a new one that
        starts here (empty: the tokens already held were read without it)."""
        if self.head is None or self.head.head is not head:
            kept = self._kept_head
            self.head = HeadContext.restore(head, kept) if kept is not None else HeadContext.new(head, len(self.tokens))
        self._kept_head = None
        return self.head

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[Any]) -> None:
        """`tokens` were read into the layers (after those already held)."""
        self.tokens.extend(tokens)

    def mark(self) -> SavedPosition:
        """Where the cache is now, to come back to (no copy: positions.mark)."""
        if self.head is not None:
            self.head.remember()
        return positions.mark(self.layers, len(self.tokens))

    def rewind(self, mark: SavedPosition) -> None:
        """Back to `mark` (or any position of these tokens): the layers as they were, the tokens and pictures after
        it forgotten."""
        positions.rewind(self.layers, mark)
        del self.tokens[mark.length :]
        self.spans[:] = [span for span in self.spans if span.start < mark.length]
        if self.head is not None:
            self.head.trim_to(mark.length)
        self._kept_head = None  # it may hold entries after the mark

    def adopt(self, layers: CacheLayers, added: Sequence[Any], head: HeadContext | None = None) -> None:
        """Go on from `layers`, a copy of this cache that read `added` after what this one holds (the batch hands
        back its own copy when a sequence ends), and from `head`, the MTP head's context over the copy where it
        read with one (None: this cache's own context did not follow the copy, and is dropped)."""
        self.layers = layers
        self.tokens.extend(added)
        if head is not None and self.head is not None:
            head.inherit_marks(self.head)
        self.head, self._kept_head = head, None

    def save(self) -> SavedPosition:
        """A detached position of the cache as it is (no copy at the time: positions.save), with the pictures read
        so far (a request queues its whole tail as one span before reading it: the position keeps what it holds)
        and the MTP head's context."""
        held = len(self.tokens)
        head = self.head.saved(held) if self.head is not None else self._kept_head
        return positions.save(self.layers, self.tokens, [span.until(held) for span in self.spans if span.start < held], head)
