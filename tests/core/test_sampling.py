"""Model-card sampling presets, overrides and the mlx-lm sampler they build."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macapp.core.sampling import PENALTY_WINDOW, PRESETS, SamplingParams, greedy, make_sampler_and_processors, preset


def test_presets_match_the_model_card():
    card = {
        (True, "general"): (1.0, 0.95, 20, 0.0, 1.5),
        (True, "precise"): (0.6, 0.95, 20, 0.0, 0.0),
        (False, "general"): (0.7, 0.8, 20, 0.0, 1.5),
        (False, "reasoning"): (1.0, 1.0, 40, 0.0, 2.0),
    }
    for key, values in card.items():
        p = PRESETS[key]
        assert (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty) == values
    assert preset(True).max_tokens >= 32768


def test_every_field_can_be_overridden_and_none_keeps_the_preset():
    p = preset(False, "general", temperature=0.2, top_p=None, top_k=5, min_p=0.05, presence_penalty=0.0, max_tokens=64, seed=7)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty, p.max_tokens, p.seed) == (0.2, 0.8, 5, 0.05, 0.0, 64, 7)


def test_unknown_styles_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="precise"):
        preset(False, "precise")
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(min_p=1.5), dict(max_tokens=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad).validate()


def test_the_sampler_is_mlx_lms_and_greedy_is_argmax():
    sampler, processors = make_sampler_and_processors(greedy(logit_bias={3: 100.0}))
    logprobs = mx.log(mx.softmax(mx.array([[0.0, 5.0, 1.0, 0.0]]), axis=-1))
    assert sampler(logprobs).item() == 1
    biased = processors[0](mx.array([1]), logprobs)
    assert sampler(biased).item() == 3
    _, with_penalty = make_sampler_and_processors(preset(True))
    assert len(with_penalty) == 1  # the presence penalty


def test_the_presence_penalty_reaches_back_over_the_wider_window():
    _, (penalty,) = make_sampler_and_processors(preset(True))  # presence penalty 1.5
    history = mx.array([5] + [1] * (PENALTY_WINDOW - 1))
    logits = penalty(history, mx.zeros((1, 8)))[0].tolist()
    assert logits[5] == -1.5 and logits[1] == -1.5 and logits[3] == 0.0  # 5 is PENALTY_WINDOW tokens back, still seen
    older = penalty(mx.array([5] + [1] * PENALTY_WINDOW), mx.zeros((1, 8)))[0].tolist()
    assert older[5] == 0.0 and PENALTY_WINDOW > 20  # beyond the window it is not (mlx-lm's default window is 20)


def test_the_frequency_penalty_counts_each_earlier_use():
    _, (penalty,) = make_sampler_and_processors(greedy(frequency_penalty=0.5))
    logits = penalty(mx.array([2, 2, 2, 4]), mx.zeros((1, 8)))[0].tolist()
    assert logits[2] == -1.5 and logits[4] == -0.5 and logits[1] == 0.0
    assert make_sampler_and_processors(greedy())[1] == []  # off by default
