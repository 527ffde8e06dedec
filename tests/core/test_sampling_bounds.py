"""Nothing out of range reaches MLX from the sampling settings: logit-bias ids past the vocabulary are refused by
check_logit_bias and, should one get through, left out by the processor; a top_k not below the vocabulary is off."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macapp.core.sampling import check_logit_bias, greedy, make_sampler_and_processors, preset


def test_check_logit_bias_refuses_ids_outside_the_vocabulary_by_name():
    check_logit_bias({0: 1.0, 99: -100.0}, 100)
    check_logit_bias(None, 100)
    with pytest.raises(ValueError, match=r"100\b.*0 to 99"):
        check_logit_bias({5: 1.0, 100: 2.0}, 100)
    with pytest.raises(ValueError, match="999999999"):
        check_logit_bias({999999999: 5.0}, 248320)
    with pytest.raises(ValueError, match="-1"):
        check_logit_bias({-1: 5.0}, 100)
    with pytest.raises(ValueError, match="and 2 more"):
        check_logit_bias({i: 1.0 for i in range(100, 107)}, 100)


def test_an_out_of_range_bias_id_is_left_out_and_the_others_apply():
    _, (bias,) = make_sampler_and_processors(greedy(logit_bias={2: 10.0, 999_999_999: 5.0, 4: 1.0}))
    logits = mx.zeros((1, 4))
    out = bias(mx.array([0]), logits)
    mx.eval(out)
    assert out.tolist() == [[0.0, 0.0, 10.0, 0.0]]


def test_a_bias_only_out_of_range_changes_nothing():
    _, (bias,) = make_sampler_and_processors(greedy(logit_bias={10**9: 5.0}))
    logits = mx.array([[1.0, 2.0, 3.0]])
    assert bias(mx.array([0]), logits).tolist() == [[1.0, 2.0, 3.0]]


@pytest.mark.parametrize("top_k", [3, 4, 10**9])
def test_a_top_k_not_below_the_vocabulary_samples_from_all(top_k):
    sampler, _ = make_sampler_and_processors(preset(False, top_k=top_k, temperature=1.0, top_p=1.0, seed=1))
    logprobs = mx.log(mx.softmax(mx.array([[0.0, 5.0, 1.0]]), axis=-1))
    token = sampler(logprobs).item()
    assert 0 <= token < 3


def test_a_top_k_below_the_vocabulary_still_applies():
    sampler, _ = make_sampler_and_processors(preset(False, top_k=1, temperature=1.0, top_p=1.0))
    logprobs = mx.log(mx.softmax(mx.array([[0.0, 5.0, 1.0, 0.5]]), axis=-1))
    assert {sampler(logprobs).item() for _ in range(20)} == {1}
