"""One sequence of the engine's batch loop (batch.py): its cache and what it reads into it, how it samples, and who
hears of it. Every chat turn (ChatSession) and every API request (serving.runner.ServingEngine) is one; the loop
runs it alone (solo.py) or beside others in mlx-lm's BatchGenerator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.reply import SequenceReply
from macapp.core.engine.jobs import Job
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import KVQuantization, MTPMode
from macapp.core.engine.positions import SavedPosition
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.engine.reply import StreamedReply
from macapp.core.fit.estimate import DEFAULT_PREFILL_STEP

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

    from macapp.core.engine.model_folder import LoadedModel


class SegmentEnd(Protocol):
    """Where a segment of a sequence's prompt ends: `length` tokens held; a position there on request."""

    length: int

    def mark(self) -> SavedPosition:
        """A mark there (no copy), to rewind the cache the sequence ends with (regenerate, edit)."""

    def save(self) -> SavedPosition:
        """A detached position there (the API's pool, the disk)."""


@dataclass(eq=False)
class Sequence:
    """One sequence for the batch: its cache and what it reads into it, how it samples, and who hears of it.

    `segments`: the prompt tokens to read after what `prompt` holds, split where the caller wants to hear of a
    boundary; the last segment is the prompt's last token alone. Alone (solo.py) it is read into `prompt`'s own
    layers; in the batch into mlx-lm's copy of them (which `on_done` hands back). A stop while reading leaves the
    layers part read: the owner rewinds them (a chat session) or drops them (a request)."""

    job: Job
    prompt: PromptCache
    segments: list[list[int]]
    sampler: Sampler
    processors: list[LogitsProcessor]
    reply: SequenceReply
    # a segment was read: a position there on request (its tokens, and the MTP head's context where one is kept)
    on_segment: Callable[[SegmentEnd], None] | None = None
    # (the reply, the cache holding it when `keep_cache` and the MTP head's context over that cache where the
    # sequence read with it to the end: solo.py) once it ended; None: stopped or failed while reading.
    # The loop settles the job after it.
    on_done: Callable[[StreamedReply | None, CacheLayers | None, HeadContext | None], None] = lambda _reply, _cache, _head: None
    on_failed: Callable[[], None] = lambda: None  # an error ended it (its cache is in an unknown state); on_done follows
    keep_cache: bool = False  # hand the sequence's cache to on_done (a chat session goes on from it)
    mtp: MTPMode = MTPMode.OFF  # the MTP head drafts while the sequence is alone (solo.py); the batch decodes plain
    mtp_policy: DepthPolicy | None = None  # the conversation's measurements (None: a fresh one)
    kv: KVQuantization = field(default_factory=KVQuantization)  # the batch's (BatchLoop.kv): quantized KV when bits
    prefill_step: int = DEFAULT_PREFILL_STEP  # tokens read per forward pass while alone (the batch has its own)
    # Pictures (mlx-vlm's positions): the model that reads it (its positioned language model) and the embeddings of
    # its segments' tokens, in order (the tower's features in place of the image tokens). It then runs alone.
    runs_on: LoadedModel | None = None
    embeddings: mx.array | None = None
    keys: list[int | str] | None = None  # its whole prompt as positions record it (a picture's tokens: its digest)
    alone: bool = False  # runs alone to its end (pictures; a server that batches nothing), pausing the batch
    read: int = 0  # prompt tokens read so far
    joined_at: int = 0  # prompt tokens read before it joined the batch (alone first: solo.py)
    start: int = 0  # tokens the cache held at the start
    total: int = 0  # prompt tokens to read
    bounds: list[int] = field(default_factory=list)  # where each segment ends (tokens read), in order

    def __post_init__(self) -> None:
        at = self.start = len(self.prompt)
        for segment in self.segments:
            at += len(segment)
            self.bounds.append(at)
        self.total = at - self.start

    @property
    def must_run_alone(self) -> bool:
        return self.alone or self.runs_on is not None

    def tokens_until(self, at: int) -> list[int | str]:
        """The first `at` tokens of the sequence's prompt (those `prompt` holds, then its segments'), as positions
        record them (`keys`)."""
        if self.keys is not None:
            return self.keys[:at]
        tokens: list[int | str] = list(self.prompt.tokens)
        for segment in self.segments:
            if len(tokens) >= at:
                break
            tokens.extend(segment)
        return tokens[:at]


Starter = Callable[["LoadedModel"], "Sequence | None"]  # made on the worker when the batch takes it; None: it ended already
