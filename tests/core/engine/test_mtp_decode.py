"""Speculative decoding with the MTP head (mtp_decode.py, run by the lone executor solo.py): greedy output token for token
the plain decode's, and the cache after every kind of round (kept, rejected, stopped mid-draft, eos in a draft)
as a fresh read of the tokens it accounts for."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from macapp.core.engine.clock import TurnClock
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import KVQuantization, MTPMode
from macapp.core.engine.prefill import prefill
from macapp.core.sampling import greedy
from tests.core.engine.helpers import EXACT, stream_alone

PROMPTS = [
    ("Hello there", True),
    ("What is the answer to this question?", True),
    ("hi", False),
    ("Tell me about the local model cache and its speed on apple silicon", False),
    ("one two three four five six seven eight nine ten", True),
    ("Why is the sky blue? Please think very carefully first.", False),
]
PROBE = 7


def prompt_ids(m, text: str, thinking: bool) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(m.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking))


def banned(m, **overrides):
    """Greedy with eos banned (mlx-lm's logit bias: the processors' walk): long, context-dependent text."""
    vocab = m.tokenizer.get_vocab()
    return greedy(overrides.pop("max_tokens", 48), logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9}, **overrides)


def reply(m, ids, params, mode, *, thinking=True, budget=None, stop_after=None, policy=None, kv=KVQuantization()):
    """One lone reply over a fresh cache holding `ids` (all but the last read first); (StreamedReply, cache)."""
    cache = make_prompt_cache(m.model)
    prefill(m, cache, ids[:-1])
    asked = []

    def should_stop():  # asked after every token: yes after `stop_after` of them
        asked.append(1)
        return stop_after is not None and len(asked) >= stop_after

    streamed = stream_alone(
        m,
        cache,
        ids[-1:],
        held=ids[:-1],
        limit=4096,
        params=params,
        thinking=thinking,
        budget=budget,
        should_stop=should_stop,
        emit=lambda _event: None,
        clock=TurnClock(),
        kv=kv,
        mtp=mode,
        mtp_policy=policy,
    )
    return streamed, cache


def next_logits(m, cache):
    return m.model(mx.array([[PROBE]]), cache=cache)[0, -1]


def fresh_logits(m, prompt, added):
    """The next-step logits of a fresh cache that read `prompt` (but its last token) as a prompt is read, then
    `added` one token at a time as decoding reads them, then the probe. (Read in one pass instead, the tokens
    give logits that differ by float32 noise, and on the MoE model by a flipped expert choice now and then.)"""
    cache = make_prompt_cache(m.model)
    prefill(m, cache, prompt[:-1])
    for token in prompt[-1:] + list(added[1:]):
        m.model(mx.array([[token]]), cache=cache)
    return next_logits(m, cache)


def read_logits(m, tokens):
    cache = make_prompt_cache(m.model)
    prefill(m, cache, tokens)
    return next_logits(m, cache)


def assert_same(m, ids, params, fresh=True, **kw):
    """MTP on and off give the same reply and tokens; the MTP cache equals the plain one and (`fresh`) a fresh read."""
    plain, plain_cache = reply(m, ids, params, MTPMode.OFF, **kw)
    fast, fast_cache = reply(m, ids, params, MTPMode.ON, policy=DepthPolicy(MTPMode.ON), **kw)
    a, b = plain.reply, fast.reply
    assert (b.token_ids, b.text, b.reasoning, b.finish_reason, b.budget_hit) == (a.token_ids, a.text, a.reasoning, a.finish_reason, a.budget_hit)
    assert fast.tokens_added == plain.tokens_added and fast.still_reasoning == plain.still_reasoning
    assert b.stats.generation_tokens == a.stats.generation_tokens and b.stats.context_tokens == a.stats.context_tokens
    mtp_logits = next_logits(m, fast_cache)
    assert mx.abs(mtp_logits - next_logits(m, plain_cache)).max().item() < EXACT
    if fresh:
        assert mx.abs(mtp_logits - fresh_logits(m, ids, fast.tokens_added)).max().item() < EXACT
    return plain, fast


@pytest.mark.parametrize("kind,head", [("dense", "right"), ("moe", "right"), ("moe", "successor"), ("dense", "successor"), ("moe", "random")])
def test_greedy_output_is_the_plain_decodes_over_many_prompts(tiny_mtp, load_tiny, kind, head):
    m = load_tiny(tiny_mtp(kind, head))
    steps = 0
    for text, thinking in PROMPTS:
        ids = prompt_ids(m, text, thinking)
        for params, fresh in ((greedy(32), False), (banned(m, max_tokens=32), True), (banned(m, presence_penalty=1.5, max_tokens=24), False)):
            _, fast = assert_same(m, ids, params, fresh=fresh, thinking=thinking)
            steps += fast.reply.stats.mtp_steps
    assert steps > 0  # MTP really ran


def test_the_heads_acceptance_shows_in_the_stats(tiny_mtp, load_tiny):
    ids_for = lambda m: prompt_ids(m, "Hello there", True)  # noqa: E731
    right = load_tiny(tiny_mtp("dense", "right"))
    _, fast = assert_same(right, ids_for(right), greedy(60))
    st = fast.reply.stats
    assert st.mtp_acceptance == 1.0 and st.mtp_accepted == st.mtp_drafted > 0 and st.mtp_tokens_per_step > 1.5
    random = load_tiny(tiny_mtp("moe", "random"))
    _, fast = assert_same(random, ids_for(random), banned(random))
    st = fast.reply.stats
    assert st.mtp_steps > 0 and st.mtp_acceptance < 0.2 and st.mtp_tokens_per_step < 1.2
    mixed = load_tiny(tiny_mtp("moe", "successor"))  # right on the script, wrong off it: kept and rejected drafts
    _, fast = assert_same(mixed, ids_for(mixed), banned(mixed, max_tokens=64))
    st = fast.reply.stats
    assert 0 < st.mtp_accepted < st.mtp_drafted


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 5, 6, 7, 9, 13])
def test_a_stop_mid_draft_keeps_exactly_the_tokens_given(tiny_mtp, load_tiny, stop_after):
    m = load_tiny(tiny_mtp("dense", "right"))  # every draft kept: long rounds, so a stop lands inside one
    plain, fast = assert_same(m, prompt_ids(m, "Hello there", True), greedy(60), stop_after=stop_after)
    assert fast.reply.finish_reason == "stopped" and len(fast.reply.token_ids) == stop_after


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 8])
def test_max_tokens_ends_the_reply_where_plain_decoding_does(tiny_mtp, load_tiny, max_tokens):
    m = load_tiny(tiny_mtp("moe", "right"))
    _, fast = assert_same(m, prompt_ids(m, "Hello there", True), greedy(max_tokens))
    assert fast.reply.finish_reason == "length" and len(fast.reply.token_ids) == max_tokens


def test_eos_inside_a_draft_ends_the_reply_there(tiny_mtp, load_tiny):
    m = load_tiny(tiny_mtp("moe", "successor"))  # the script ends in <|im_end|>, which the head drafts
    for text, thinking in PROMPTS[:3]:
        _, fast = assert_same(m, prompt_ids(m, text, thinking), greedy(60), thinking=thinking)
        assert fast.reply.finish_reason == "stop" and fast.tokens_added[-1] == m.im_end_id


@pytest.mark.parametrize("budget", [0, 1, 3, 7])
def test_the_thinking_budget_closes_the_reasoning_as_plain_decoding_does(tiny_mtp, load_tiny, budget):
    m = load_tiny(tiny_mtp("dense", "right"))
    ids = prompt_ids(m, "Hello there", True)
    _, fast = assert_same(m, ids, greedy(40), budget=budget)
    if budget:
        assert fast.reply.budget_hit and fast.reply.stats.forced_tokens > 0


def test_a_quantized_build_decodes_the_same(tiny_mtp, load_tiny):
    for kind, head in (("moe", "right"), ("dense", "successor")):
        m = load_tiny(tiny_mtp(kind, head, 4))
        for text, thinking in PROMPTS[:3]:
            assert_same(m, prompt_ids(m, text, thinking), banned(m), thinking=thinking)


def test_the_head_in_the_side_file_decodes_the_same(tiny_mtp, load_tiny):
    m = load_tiny(tiny_mtp("moe", "right", side=True))
    _, fast = assert_same(m, prompt_ids(m, "Hello there", True), greedy(40))
    assert fast.reply.stats.mtp_acceptance == 1.0


def test_auto_turns_a_head_that_does_not_pay_off_and_keeps_one_that_does(tiny_mtp, load_tiny):
    random = load_tiny(tiny_mtp("moe", "random"))
    policy = DepthPolicy(MTPMode.AUTO)
    ids = prompt_ids(random, "Hello there", True)
    plain, _ = reply(random, ids, banned(random, max_tokens=60), MTPMode.OFF)
    fast, _ = reply(random, ids, banned(random, max_tokens=60), MTPMode.AUTO, policy=policy)
    assert fast.reply.token_ids == plain.reply.token_ids and fast.tokens_added == plain.tokens_added
    assert policy.off and "acceptance" in policy.off_reason
    assert fast.reply.stats.mtp_steps <= 6  # found out within a few rounds, then mlx-lm's own loop
    again, _ = reply(random, ids, banned(random, max_tokens=20), MTPMode.AUTO, policy=policy)
    assert again.reply.stats.mtp_steps == 0 and again.reply.token_ids == plain.reply.token_ids[:20]
    # "on" keeps drafting whatever it measures
    on = DepthPolicy(MTPMode.ON)
    forced, _ = reply(random, ids, banned(random, max_tokens=40), MTPMode.ON, policy=on)
    assert not on.off and forced.reply.stats.mtp_steps >= 20


def test_mtp_off_and_a_quantized_kv_cache_decode_plainly(tiny_mtp, load_tiny):
    m = load_tiny(tiny_mtp("dense", "right"))
    ids = prompt_ids(m, "Hello there", True)
    off, _ = reply(m, ids, greedy(30), MTPMode.OFF)
    assert off.reply.stats.mtp_steps == 0
    quantized, _ = reply(m, ids, greedy(30), MTPMode.ON, kv=KVQuantization(bits=8))
    assert quantized.reply.stats.mtp_steps == 0 and quantized.reply.token_ids == off.reply.token_ids


def test_a_rejected_draft_leaves_the_deltanet_state_as_a_fresh_read(tiny_mtp, load_tiny):
    """The check can fail: a verify pass over rejected drafts, not rolled back, shows in the next logits."""
    from macapp.core.engine.positions import mark, rewind

    m = load_tiny(tiny_mtp("moe", "random"))
    ids = prompt_ids(m, "Hello there", True)
    cache = make_prompt_cache(m.model)
    prefill(m, cache, ids)
    snap = mark(cache, len(ids))
    m.model(mx.array([[11, 12, 13]]), cache=cache)  # a verify pass whose drafts are all rejected
    for layer in cache:  # trimming the KV layers alone is not enough: the DeltaNet layers read the drafts
        if layer.is_trimmable():
            layer.trim(3)
    wrong = mx.abs(next_logits(m, cache) - read_logits(m, ids)).max().item()
    assert wrong > 100 * EXACT
    rewind(cache, snap)
    mx.eval([c.state for c in cache])
    assert mx.abs(next_logits(m, cache) - read_logits(m, ids)).max().item() < EXACT
