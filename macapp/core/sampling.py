"""Sampling settings: the Qwen3.5 model card's presets per mode, every field overridable.

| mode                    | temperature | top_p | top_k | min_p | presence_penalty |
|-------------------------|-------------|-------|-------|-------|------------------|
| thinking, general       | 1.0         | 0.95  | 20    | 0     | 1.5              |
| thinking, precise       | 0.6         | 0.95  | 20    | 0     | 0                |
| non-thinking, general   | 0.7         | 0.8   | 20    | 0     | 1.5              |
| non-thinking, reasoning | 1.0         | 1.0   | 40    | 0     | 2.0              |

The card suggests generous output budgets for thinking (~32K tokens). `temperature` 0 is greedy.
mlx-lm applies the presence penalty over a window of recent tokens (`penalty_window`, default 20 in
mlx-lm); the engine passes a wider window so it acts like the card's "penalise what was already said".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # MLX is imported on the worker, when a sampler is made
    import mlx.core as mx
    from mlx_lm.sample_utils import LogitsProcessor, Sampler

THINKING_MAX_TOKENS = 32768
NON_THINKING_MAX_TOKENS = 16384
PENALTY_WINDOW = 256


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    max_tokens: int = NON_THINKING_MAX_TOKENS
    seed: int | None = None
    logit_bias: dict[int, float] | None = field(default=None)
    penalty_window: int = PENALTY_WINDOW
    frequency_penalty: float = 0.0  # OpenAI's: subtracted once per earlier use of a token in the window

    def with_overrides(self, **overrides: Any) -> "SamplingParams":
        """A copy with the given fields changed; None values are ignored (so CLI flags can pass through)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def validate(self) -> None:
        """Raise ValueError with a clear message for values mlx-lm would misbehave on."""
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 or more, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or more, not {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), not {self.min_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {self.max_tokens}")


PRESETS: dict[tuple[bool, str], SamplingParams] = {
    (True, "general"): SamplingParams(1.0, 0.95, 20, 0.0, 1.5, max_tokens=THINKING_MAX_TOKENS),
    (True, "precise"): SamplingParams(0.6, 0.95, 20, 0.0, 0.0, max_tokens=THINKING_MAX_TOKENS),
    (False, "general"): SamplingParams(0.7, 0.8, 20, 0.0, 1.5, max_tokens=NON_THINKING_MAX_TOKENS),
    (False, "reasoning"): SamplingParams(1.0, 1.0, 40, 0.0, 2.0, max_tokens=NON_THINKING_MAX_TOKENS),
}

STYLES = {True: ("general", "precise"), False: ("general", "reasoning")}


def preset(thinking: bool, style: str = "general", **overrides: Any) -> SamplingParams:
    """The model card's preset for a mode ("general" / "precise" with thinking, "general" / "reasoning" without)."""
    key = (bool(thinking), style)
    if key not in PRESETS:
        raise ValueError(f"no {style!r} preset {'with' if thinking else 'without'} thinking; choose from {', '.join(STYLES[bool(thinking)])}")
    return PRESETS[key].with_overrides(**overrides)


def greedy(max_tokens: int = 256, **overrides: Any) -> SamplingParams:
    """Deterministic decoding (temperature 0, no penalties): for tests and benchmarks."""
    return SamplingParams(0.0, 1.0, 0, 0.0, 0.0, max_tokens=max_tokens).with_overrides(**overrides)


def check_logit_bias(bias: dict[int, float] | None, vocab_size: int) -> None:
    """Raise ValueError naming the token ids `bias` gives that the model does not have (ids 0..vocab_size-1).
    MLX does not check indices: an id past the logits reads and writes out of bounds (a crash, not an error)."""
    if not bias:
        return
    outside = sorted(i for i in bias if not 0 <= i < vocab_size)
    if outside:
        shown = ", ".join(map(str, outside[:5])) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
        raise ValueError(f"logit_bias names token id{'s' * (len(outside) > 1)} {shown}, outside this model's vocabulary (ids 0 to {vocab_size - 1})")


def make_sampler_and_processors(params: SamplingParams) -> tuple[Sampler, list[LogitsProcessor]]:
    """mlx-lm's own sampler and logits processors for these settings (imports MLX: call on the worker).

    Whatever was checked before, nothing out of range reaches MLX: logit-bias ids past the logits are left out
    and a top_k not below the vocabulary is no top_k (mlx-lm raises on it), both decided from the logits' size."""
    from mlx_lm.sample_utils import make_logits_processors

    processors = make_logits_processors(
        logit_bias=None,
        repetition_penalty=params.repetition_penalty or None,
        repetition_context_size=params.penalty_window,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=params.penalty_window,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=params.penalty_window,
    )
    if params.logit_bias:  # first, where mlx-lm puts its own
        processors.insert(0, _bias_processor(params.logit_bias))
    return _sampler(params), processors


def _sampler(params: SamplingParams) -> Sampler:
    from mlx_lm.sample_utils import make_sampler

    if params.seed is not None and params.temperature > 0:
        return _keyed_sampler(params)

    def build(top_k: int) -> Sampler:
        return make_sampler(temp=params.temperature, top_p=params.top_p if params.top_p < 1 else 0.0, min_p=params.min_p, top_k=top_k)

    with_k = build(params.top_k)
    if params.top_k <= 0 or params.temperature == 0:
        return with_k
    without_k = build(0)
    return lambda logprobs: (with_k if params.top_k < logprobs.shape[-1] else without_k)(logprobs)


def filtered_logprobs(logprobs: mx.array, params: SamplingParams) -> mx.array:
    """mlx-lm's make_sampler chain before its draw, copied (core/upstream.py lists it): top-p, min-p, top-k (one
    not below the vocabulary is none), in that order, on log-probabilities. The seeded sampler below and the MTP
    acceptance rule (engine/mtp_accept.py) sample from exactly what plain decoding samples from."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    if 0 < params.top_p < 1:
        logprobs = apply_top_p(logprobs, params.top_p)
    if params.min_p != 0:
        logprobs = apply_min_p(logprobs, params.min_p)
    if 0 < params.top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, params.top_k)
    return logprobs


def _keyed_sampler(params: SamplingParams) -> Sampler:
    """mlx-lm's sampler (filtered_logprobs, then categorical at the temperature) drawing from a random key of its
    own, seeded with `params.seed` and split at every token: a seeded reply is the same alone or beside other
    sequences of a batch (mlx-lm's sampler draws from MLX's one global key)."""
    import mlx.core as mx

    key = [mx.random.key(params.seed or 0)]

    def sample(logprobs: mx.array) -> mx.array:
        key[0], now = mx.random.split(key[0])
        return mx.random.categorical(filtered_logprobs(logprobs, params) * (1.0 / params.temperature), key=now)

    return sample


def _bias_processor(bias: dict[int, float]) -> LogitsProcessor:
    import mlx.core as mx

    by_size: dict[int, tuple[mx.array, mx.array] | None] = {}

    def process(_tokens: mx.array, logits: mx.array) -> mx.array:
        size = logits.shape[-1]
        if size not in by_size:
            kept = [i for i in bias if 0 <= i < size]
            by_size[size] = (mx.array(kept), mx.array([bias[i] for i in kept], dtype=mx.float32)) if kept else None
        pair = by_size[size]
        return logits if pair is None else logits.at[:, pair[0]].add(pair[1].astype(logits.dtype))

    return process
