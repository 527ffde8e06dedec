"""Reading a prompt into a cache: mlx-lm's prefill, chunk by chunk, with progress and a stop between chunks."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Callable, Sequence

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.options import KVQuantization
from macapp.core.fit.estimate import DEFAULT_PREFILL_STEP

if TYPE_CHECKING:
    import mlx.core as mx

    from macapp.core.engine.mtp_context import HeadContext
    from macapp.core.engine.model_folder import LoadedModel


def wired_memory(model: "LoadedModel") -> AbstractContextManager[None]:
    """mlx-lm's wired_limit for this model: wrap one turn (its prefill and its reply stream) in it."""
    from mlx_lm.generate import generation_stream, wired_limit

    # mlx-lm's own generation_stream is a ThreadLocalStream, which its wired_limit annotates as a list of Stream
    return wired_limit(model.model, [generation_stream])  # type: ignore[list-item]


def prefill(
    model: "LoadedModel",
    cache: CacheLayers,
    tokens: Sequence[int],
    *,
    step: int = DEFAULT_PREFILL_STEP,
    kv: KVQuantization = KVQuantization(),
    should_stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int], None] | None = None,
    embeddings: mx.array | None = None,
    head: HeadContext | None = None,
    held: int = 0,
) -> int:
    """Read `tokens` into `cache` (a prompt cache of `model`, from mlx-lm's make_prompt_cache); return how many
    were read: all of them, unless `should_stop()` said yes before a chunk.

    The same steps as mlx-lm's generate_step prefill: chunks of `step` tokens on mlx-lm's generation stream,
    the KV cache quantized when `kv` says so, each chunk evaluated and MLX's buffer cache freed after it;
    `on_progress(tokens read so far)` after each chunk. A stop is only seen between chunks (a chunk cannot be
    interrupted), so the caller answers a stop at once by other means (Job.arm_early_reply) if it must.

    `embeddings` (one row per token, mx.array): fed instead of the token embeddings (a turn with pictures, on a
    model that takes them: vision.runner.PositionedLM).

    `head`: the MTP head's context over `cache` (mtp_context.py), which holds `held` tokens before `tokens`: each
    chunk's post-norm hidden states go into it as they come (the chunk then runs through the model's body alone;
    the lm_head's logits, which a prefill never evaluates anyway, are not asked for).

    Usually fed all but the prompt's last token: the sequence's executor feeds that one, so the cache can be snapshotted
    right before the reply. Run it on the engine's worker thread (Engine.submit), inside `wired_memory(model)`.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream, maybe_quantize_kv_cache

    total = len(tokens)
    step = max(1, step)
    quantize = kv.kwargs()
    done = 0
    with mx.stream(generation_stream):
        while done < total:
            if should_stop is not None and should_stop():
                break
            n = min(step, total - done)
            chunk = list(tokens[done : done + n])
            if head is not None and embeddings is None:
                head.read(held + done, chunk, model.model.language_model.model(mx.array(chunk)[None], cache=cache))
            elif embeddings is None:
                model.model(mx.array(chunk)[None], cache=cache)
            else:  # a turn with pictures: its embeddings hold the tower's features (vision.runner.EncodedTurn)
                model.model(mx.array(chunk)[None], cache=cache, input_embeddings=embeddings[done : done + n][None])
            maybe_quantize_kv_cache(cache, **quantize)
            mx.eval([c.state for c in cache])
            done += n
            if on_progress is not None:
                on_progress(done)
            mx.clear_cache()
    return done
