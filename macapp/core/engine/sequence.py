"""One sequence of the engine's batch loop (batch.py): its cache and what it reads into it, how it samples, and who
hears of it. A chat turn (ChatSession) and an API request (serving.runner.ServingEngine) each make one; the loop
runs it alone (solo.py) or beside others in mlx-lm's BatchGenerator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.batch_reply import SequenceReply
from macapp.core.engine.jobs import Job
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import KVQuantization, MTPMode
from macapp.core.engine.positions import SavedPosition
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.engine.reply import StreamedReply

if TYPE_CHECKING:
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

    from macapp.core.engine.model_folder import LoadedModel


@dataclass(eq=False)
class Sequence:
    """One sequence for the batch: its cache and what it reads into it, how it samples, and who hears of it.

    `segments`: the prompt tokens to read after what `prompt` holds, split where the caller wants to hear of a
    boundary; the last segment is the prompt's last token alone. The batch reads into a copy of `prompt`'s layers
    (mlx-lm merges them into its batch caches): `prompt` itself is left as it was."""

    job: Job
    prompt: PromptCache
    segments: list[list[int]]
    sampler: Sampler
    processors: list[LogitsProcessor]
    reply: SequenceReply
    # a segment was read: the detached position there (its tokens, and the MTP head's context if it was kept: solo.py)
    on_segment: Callable[[SavedPosition], None] | None = None
    # (the reply, the cache holding it when `keep_cache` and the MTP head's context over that cache where the
    # sequence read with it to the end: solo.py) once it ended; None: stopped or failed while reading.
    # The loop settles the job after it.
    on_done: Callable[[StreamedReply | None, CacheLayers | None, HeadContext | None], None] = lambda _reply, _cache, _head: None
    keep_cache: bool = False  # hand the sequence's cache to on_done (a chat session goes on from it)
    mtp: MTPMode = MTPMode.OFF  # the MTP head drafts while the sequence is alone (solo.py); the batch decodes plain
    mtp_policy: DepthPolicy | None = None  # the conversation's measurements (None: a fresh one)
    kv: KVQuantization = field(default_factory=KVQuantization)  # the batch's (BatchLoop.kv): quantized KV when bits
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

    def tokens_until(self, at: int) -> list[int]:
        """The first `at` tokens of the sequence's prompt (those `prompt` holds, then its segments')."""
        tokens = list(self.prompt.tokens)
        for segment in self.segments:
            if len(tokens) >= at:
                break
            tokens.extend(segment)
        return tokens[:at]


Starter = Callable[["LoadedModel"], "Sequence | None"]  # made on the worker when the batch takes it; None: it ended already
