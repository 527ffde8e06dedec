"""Long-context mode: YaRN rope scaling past a model's native length, switched on in memory when a context asks.

The Qwen3.5 cards give 262,144 tokens natively and about 1,010,000 with YaRN (`rope_type: "yarn"`, `factor: 4`,
`original_max_position_embeddings: 262144`; factor 2 for ~524k). YaRN is static (it rescales every position,
short prompts included, and the card warns that it can lower quality on short texts), so it is turned on only
for a context above the native length, with the smallest factor that covers it, and only in the loaded model:
the downloaded config.json is never edited.

Checked against Hugging Face transformers' own Qwen3.5 model (tests/core/test_long_context_reference.py): mlx-lm's
YarnRoPE matches it (frequencies, the attention factor applied to the rotated dims only, partial rotary 0.25;
the mRoPE sections collapse to one position for text). One thing in mlx-lm's loading does not: `TextModelArgs`
reads `type` before `rope_type`, and configs that went through mlx-lm (`save_config` after a load) carry a stale
`"type": "default"` beside `rope_type`, so a card-style `rope_type: "yarn"` edit is silently ignored there. The
config built here sets both keys.

A second fix lives here too: for head dim 256, MLX runs prompt reading through its unfused attention (on every
GPU without the M5's neural accelerators, and always on the CPU), which materialises the scores of a whole
prefill chunk against the whole context — at 1M tokens and a 2048-token chunk, 16 heads × 2048 × 1M × 2 bytes
= 69 GB. `blocked_attention` splits the queries of such a chunk into blocks whose scores stay under
SCORES_BLOCK_BYTES (each query row's softmax is independent, so the result is the same).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeAlias, Union

from macapp.core import upstream
from macapp.core.jsonvalue import JSONObject, JSONValue

if TYPE_CHECKING:
    import mlx.core as mx

YARN_FACTORS = (2, 4)
CARD_NATIVE = 262_144
CARD_LONGEST = 1_010_000  # the card's "about 1,010,000 tokens" at factor 4 (not the full 4 × 262,144)
PLAIN_ROPE_TYPES = (None, "default")  # what YaRN may extend; text positions make Qwen3.5's mRoPE a plain rope
SCORES_BLOCK_BYTES = 1 << 29  # most bytes one block of attention scores may take while a prompt is read
SCORE_BYTES = 2  # bf16 scores (the queries' dtype)

if TYPE_CHECKING:
    KVBuffer: TypeAlias = Union[mx.array, tuple[mx.array, ...]]  # a KV layer's keys or values: an array, or quantized (packed, scales, biases)


class NoYarn(ValueError):
    """A model long-context mode cannot extend; the message says why."""


@dataclass(frozen=True)
class RopeInfo:
    """What a config says about its positions: the native length, a YaRN factor it already carries, and why
    long-context mode cannot apply to it (None when it can)."""

    native: int
    configured_factor: float | None
    no_yarn_reason: str | None

    @property
    def longest(self) -> int:
        """The most tokens the app runs this model at: the YaRN limit where YaRN applies, else the native length."""
        if self.configured_factor:
            return yarn_longest(self.native, self.configured_factor)
        if self.no_yarn_reason:
            return self.native
        return yarn_longest(self.native, max(YARN_FACTORS))


def _text(config: JSONObject) -> JSONObject:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def _rope_parameters(text: JSONObject) -> JSONObject:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return params if isinstance(params, dict) else {}


def _rope_type(params: JSONObject) -> JSONValue:
    # mlx-lm reads "type" first; a stale "type": "default" beside a "rope_type" would win there
    return params.get("rope_type") or params.get("type")


def yarn_longest(native: int, factor: float) -> int:
    """The longest context YaRN ×factor gives a model of `native` tokens, capped in the card's proportion
    (1,010,000 of 4 × 262,144)."""
    return int(min(native * factor, native * CARD_LONGEST / CARD_NATIVE))


def rope_info(config: JSONObject, native: int) -> RopeInfo:
    """The rope facts of a config.json (top level or text_config) whose max_position_embeddings is `native`."""
    text = _text(config)
    params = _rope_parameters(text)
    kind = _rope_type(params)
    if kind == "yarn" or params.get("type") == "yarn":
        factor = params.get("factor")
        original = params.get("original_max_position_embeddings") or native
        if isinstance(factor, (int, float)) and factor > 1 and isinstance(original, int) and original > 0:
            return RopeInfo(native=original, configured_factor=float(factor), no_yarn_reason=None)
        return RopeInfo(native=native, configured_factor=None, no_yarn_reason="its config's YaRN entry has no usable factor")
    if kind not in PLAIN_ROPE_TYPES:
        return RopeInfo(native=native, configured_factor=None, no_yarn_reason=f"its rope_type is {kind!r}, not a plain rope YaRN can extend")
    if params.get("type") not in PLAIN_ROPE_TYPES:
        return RopeInfo(native=native, configured_factor=None, no_yarn_reason=f"its rope type is {params.get('type')!r}, not a plain rope YaRN can extend")
    return RopeInfo(native=native, configured_factor=None, no_yarn_reason=None)


def factor_for(info: RopeInfo, context: int | None) -> int | None:
    """The smallest YaRN factor that covers `context` (None at or below the native length, or when the config
    sets YaRN itself); NoYarn when the context is past what YaRN reaches or the model has no YaRN."""
    if context is None or context <= info.native or info.configured_factor:
        return None
    if info.no_yarn_reason:
        raise NoYarn(f"long-context mode (YaRN) is not available for this model: {info.no_yarn_reason}")
    for factor in YARN_FACTORS:
        if yarn_longest(info.native, factor) >= context:
            return factor
    raise NoYarn(f"{context:,} tokens is past what YaRN ×{max(YARN_FACTORS)} reaches ({info.longest:,})")


def with_yarn(config: JSONObject, factor: int, native: int) -> JSONObject:
    """A copy of `config` whose text model uses YaRN ×factor over `native` positions (the file is not touched)."""
    out = copy.deepcopy(config)
    text = _text(out)
    params = dict(_rope_parameters(text))
    params.update(rope_type="yarn", type="yarn", factor=float(factor), original_max_position_embeddings=native)
    text["rope_parameters"] = params
    text.pop("rope_scaling", None)
    text["max_position_embeddings"] = yarn_longest(native, factor)
    return out


def notice(factor: float) -> str:
    """The one line every front end shows when a model runs in long-context mode."""
    shown = int(factor) if float(factor).is_integer() else factor
    return f"long-context mode: YaRN ×{shown}; the card notes it can lower quality on short texts"


# --- the loaded model ---


def _number(source: JSONObject, key: str, default: float | None = None) -> float:
    """A number field of a config (`default` when absent); TypeError for anything else, KeyError when required."""
    value = source[key] if default is None else source.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"config field {key!r} must be a number, not {value!r}")
    return value


def use_yarn(model: object, config: JSONObject) -> int:
    """Give every full-attention layer of a loaded mlx-lm Qwen3.5 model (its `layers`, each attention's `rope`)
    the rope of `config` (a with_yarn copy), built by mlx-lm's own initialize_rope; returns how many layers changed."""
    from mlx_lm.models.rope_utils import initialize_rope

    text = _text(config)
    params = _rope_parameters(text)
    head_dim = _number(text, "head_dim") if text.get("head_dim") else _number(text, "hidden_size") // _number(text, "num_attention_heads")
    dims = int(head_dim * _number(params, "partial_rotary_factor", _number(text, "partial_rotary_factor", 0.25)))
    changed = 0
    for layer in getattr(model, "layers", []):
        attention = getattr(layer, "self_attn", None)
        if attention is None or not hasattr(attention, "rope"):
            continue
        attention.rope = initialize_rope(
            dims,
            base=_number(params, "rope_theta", 10_000_000),
            traditional=False,
            scaling_config=params,
            max_position_embeddings=int(_number(text, "max_position_embeddings")),
        )
        changed += 1
    return changed


def query_block(heads: int, queries: int, keys: int, limit: int = SCORES_BLOCK_BYTES) -> int:
    """How many query rows one block of attention scores holds (all of them when they fit under `limit`)."""
    per_row = heads * keys * SCORE_BYTES
    if queries * per_row <= limit:
        return queries
    return max(1, limit // per_row)


def blocked_attention(
    queries: mx.array,
    keys: KVBuffer,
    values: KVBuffer,
    cache: object,  # the layer's mlx-lm cache, passed through
    scale: float,
    mask: mx.array | str | None,
    sinks: mx.array | None = None,
    limit: int | None = None,
) -> mx.array:
    """mlx-lm's scaled_dot_product_attention, reading the queries of a long prefill chunk in blocks so that the
    materialised scores stay under SCORES_BLOCK_BYTES; short inputs go straight through."""
    import mlx.core as mx
    from mlx_lm.models import base

    # mlx-lm annotates `mask` as an array, yet its own attention layers pass "causal", which it handles
    whole: Callable[..., mx.array] = base.scaled_dot_product_attention

    n_queries = queries.shape[2]
    n_keys = (keys[0] if isinstance(keys, (tuple, list)) else keys).shape[-2]  # quantized: (packed, scales, biases)
    block = query_block(queries.shape[1], n_queries, n_keys, SCORES_BLOCK_BYTES if limit is None else limit)
    if n_queries <= 8 or block >= n_queries or (mask is not None and not isinstance(mask, (str, mx.array))):
        return whole(queries, keys, values, cache, scale, mask, sinks)
    parts: list[mx.array] = []
    for start in range(0, n_queries, block):
        end = min(start + block, n_queries)
        q = queries[:, :, start:end]
        if isinstance(mask, mx.array):
            rows = mask[..., start:end, :] if mask.shape[-2] == n_queries else mask
            parts.append(whole(q, keys, values, cache, scale, rows, sinks))
        elif mask == "causal":
            # the block's last query sees the keys up to its own position; "causal" aligns the block to their end
            visible = n_keys - n_queries + end
            parts.append(whole(q, _upto(keys, visible), _upto(values, visible), cache, scale, "causal", sinks))
        else:
            parts.append(whole(q, keys, values, cache, scale, mask, sinks))
        mx.eval(parts[-1])  # free this block's scores before the next block is computed
    return mx.concatenate(parts, axis=2)


def _upto(kv: KVBuffer, n: int) -> KVBuffer:
    """The first `n` positions of a KV buffer (an array, or a quantized layer's (packed, scales, biases))."""
    if isinstance(kv, (tuple, list)):
        return tuple(part[..., :n, :] for part in kv)
    return kv[..., :n, :]


def install_blocked_attention() -> None:
    """Route the Qwen3.5 attention layers (mlx-lm's qwen3_next attention) through blocked_attention."""
    upstream.use_attention(blocked_attention)
