"""The acceptance rule (mtp_accept.py): with sampling, the tokens a verify pass gives follow the distribution plain
decoding samples from (statistical checks with a fixed seed and a tolerance); with greedy, the argmax."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from macapp.core.engine.mtp_accept import Acceptor
from macapp.core.sampling import SamplingParams, greedy, make_sampler_and_processors

V = 12
N = 2500
TOLERANCE = 0.06  # total variation distance; with N=2500 draws the sampling noise is about 0.03


def tv(counts: np.ndarray, probs: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - probs).sum())


def logits(seed: int, rows: int = 2) -> mx.array:
    return mx.random.normal((rows, V), key=mx.random.key(seed)) * 2.0


SETTINGS = [
    SamplingParams(temperature=1.0, top_p=1.0, top_k=0),
    SamplingParams(temperature=0.7, top_p=0.8, top_k=0),
    SamplingParams(temperature=1.0, top_p=0.95, top_k=5, min_p=0.05),
    SamplingParams(temperature=0.6, top_p=1.0, top_k=4, presence_penalty=1.5),
]


@pytest.mark.parametrize("params", SETTINGS)
def test_the_target_distribution_is_what_mlx_lms_sampler_draws_from(params):
    sampler, processors = make_sampler_and_processors(params)
    history = [1, 2, 3]
    row = logits(1)[0:1]
    acceptor = Acceptor(params, processors, history)
    probs = np.array(acceptor._probs(acceptor._processed(row, history)))[0]
    mx.random.seed(0)
    processed = row
    for p in processors:
        processed = p(mx.array(history), processed)
    logprobs = processed - mx.logsumexp(processed, axis=-1, keepdims=True)
    drawn = np.array(mx.concatenate([sampler(logprobs) for _ in range(N)]).tolist())
    assert tv(np.bincount(drawn, minlength=V), probs) < TOLERANCE


@pytest.mark.parametrize("params", SETTINGS)
@pytest.mark.parametrize("draft_rank", [0, 3])  # the likeliest token, an unlikely one (often filtered out)
def test_kept_or_resampled_the_first_token_follows_the_target(params, draft_rank):
    _, processors = make_sampler_and_processors(params)
    history = [5, 6]
    rows = logits(2 + draft_rank)
    acceptor = Acceptor(params, processors, history)
    p0 = np.array(acceptor._probs(acceptor._processed(rows[0:1], history)))[0]
    draft = int(np.argsort(-p0)[draft_rank])
    p1 = np.array(acceptor._probs(acceptor._processed(rows[1:2], history + [draft])))[0]  # sees the draft
    mx.random.seed(1)
    first, second, kept = [], [], 0
    for _ in range(N):
        verdict = acceptor.walk(rows, [draft])
        first.append(draft if verdict.accepted else verdict.token)
        if verdict.accepted:
            kept += 1
            second.append(verdict.token)
    assert tv(np.bincount(first, minlength=V), p0) < TOLERANCE
    assert abs(kept / N - p0[draft]) < 0.035  # kept with probability p(d) (q is one-hot)
    if kept > 400:
        assert tv(np.bincount(second, minlength=V), p1) < TOLERANCE + 0.02
    if p0[draft] == 0:
        assert kept == 0  # a draft the filters rule out is never kept


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    rows = logits(7, rows=4)
    targets = mx.argmax(rows, axis=-1).tolist()
    acceptor = Acceptor(greedy(), [], [])
    assert acceptor.walk(rows, targets[:3]) == (3, targets[3])
    wrong = (targets[1] + 1) % V
    assert acceptor.walk(rows, [targets[0], wrong, targets[2]]) == (1, targets[1])
    assert acceptor.walk(rows, [(targets[0] + 1) % V, targets[1], targets[2]]) == (0, targets[0])


def test_greedy_with_processors_walks_each_position_on_its_own_history():
    params = greedy(presence_penalty=50.0)  # a token already seen cannot win
    _, processors = make_sampler_and_processors(params)
    rows = mx.zeros((3, V)).at[:, 3].add(5.0).at[:, 4].add(4.0)  # 3 is the argmax everywhere, 4 second
    acceptor = Acceptor(params, processors, [9])
    # after drafting 3, position 1 sees it, so its target is 4: the draft 3 there is rejected
    assert acceptor.walk(rows, [3, 3]) == (1, 4)
    assert acceptor.walk(rows, [3, 4]) == (2, 0)  # 3 and 4 both seen: the next best of the zeros, token 0
