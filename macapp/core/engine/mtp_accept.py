"""Which drafted tokens a verify pass keeps: the standard speculative acceptance rule, on mlx-lm's own sampling.

The target distribution at each position is exactly what plain decoding samples from: the logits processors
(penalties, logit bias) on the tokens so far, mlx-lm's filters in make_sampler's order (top-p, min-p, top-k, on
log-probabilities), then the temperature. The drafter is greedy, so its q is one-hot: a draft d is kept with
probability p(d); on a rejection the token comes from p with d removed (max(0, p - q) normalized); when every
draft is kept the bonus token comes from p at the last position. At temperature 0 that is: keep d while it is
the argmax, then take the argmax. Either way the tokens follow the plain decode's distribution (greedy: its
very tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from macapp.core.sampling import SamplingParams, filtered_logprobs

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_lm.sample_utils import LogitsProcessor


class Verdict(NamedTuple):
    accepted: int  # how many drafts were kept (0..k)
    token: int  # the target's own token after them (the correction, or the bonus when all were kept)


class Acceptor:
    """The acceptance walk for one stream's sampling settings; `history` is every token the logits processors
    have seen so far (mlx-lm's generate_step: this stream's segment and sampled tokens)."""

    def __init__(self, params: SamplingParams, processors: Sequence["LogitsProcessor"], history: list[int]):
        self.params = params
        self.processors = list(processors)
        self.history = history
        self.greedy = params.temperature == 0

    def first(self, logits: "mx.array") -> int:
        """The token after a plain step (`logits`: one row, processors not yet applied; history already holds the
        fed tokens). Greedy: the argmax; else a sample from the target distribution."""
        import mlx.core as mx

        row = self._processed(logits[None], self.history)
        if self.greedy:
            return token_of(mx.argmax(row, axis=-1))
        return token_of(mx.random.categorical(mx.log(self._probs(row))))

    def walk(self, logits: "mx.array", drafts: Sequence[int]) -> Verdict:
        """`logits` (k+1 rows): the verify pass over [last token, *drafts]; the history holds the tokens up to and
        including the last token. Returns the verdict; the history is not changed."""
        import mlx.core as mx

        k = len(drafts)
        if self.greedy and not self.processors:
            targets = tokens_of(mx.argmax(logits, axis=-1))  # one sync for the whole walk
            accepted = next((j for j in range(k) if targets[j] != drafts[j]), k)
            return Verdict(accepted, targets[accepted])
        for j in range(k + 1):
            row = self._processed(logits[j : j + 1], self.history + list(drafts[:j]))
            if self.greedy:
                target = token_of(mx.argmax(row, axis=-1))
                if j < k and target == drafts[j]:
                    continue
                return Verdict(j, target)
            probs = self._probs(row)
            if j == k:
                return Verdict(k, token_of(mx.random.categorical(mx.log(probs))))
            d = drafts[j]
            if number_of(mx.random.uniform()) < number_of(probs[0, d]):
                continue
            residual = probs.at[0, d].multiply(0.0)
            return Verdict(j, token_of(mx.random.categorical(mx.log(residual))))
        raise AssertionError("unreachable")  # pragma: no cover

    def _processed(self, row: "mx.array", tokens: list[int]) -> "mx.array":
        if not self.processors:
            return row
        import mlx.core as mx

        seen = mx.array(tokens)
        for processor in self.processors:
            row = processor(seen, row)
        return row

    def _probs(self, row: "mx.array") -> "mx.array":
        """The distribution mlx-lm's sampler draws from for these processed logits (one row)."""
        import mlx.core as mx

        logprobs = filtered_logprobs(row - mx.logsumexp(row, axis=-1, keepdims=True), self.params)
        return mx.softmax(logprobs * (1 / self.params.temperature), axis=-1)


def token_of(a: "mx.array") -> int:
    """The token id in a one-element integer array."""
    value = a.item()
    if not isinstance(value, int):
        raise TypeError(f"a token id is an integer, not {value!r}")
    return value


def number_of(a: "mx.array") -> float:
    """The real number in a one-element array."""
    value = a.item()
    if not isinstance(value, (int, float)):
        raise TypeError(f"a probability is a real number, not {value!r}")
    return value


def tokens_of(a: "mx.array") -> list[int]:
    """The token ids in a one-dimensional integer array."""
    values = a.tolist()
    ints = [v for v in values if isinstance(v, int)] if isinstance(values, list) else []
    if not isinstance(values, list) or len(ints) != len(values):
        raise TypeError(f"token ids are a list of integers, not {values!r}")
    return ints
