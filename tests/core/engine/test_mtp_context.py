"""The MTP head's own context (mtp_context.py): filled from the prompt as it is read, the same entries and drafts
as mlx-vlm's own `prefill_from_target_hidden` over the whole sequence, and kept through turns, rewinds and the
API pool's checkpoints; the output stays the plain decode's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.clock import TurnClock
from macapp.core.engine.mtp_context import HeadContext
from macapp.core.engine.mtp_policy import DepthPolicy
from macapp.core.engine.options import MTPMode
from macapp.core.engine.prefill import prefill
from macapp.core.engine.prompt_cache import PromptCache
from tests.core.engine.helpers import stream_alone
from macapp.core.sampling import greedy
from macapp.core.serving.requests import ChatMessage, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.engine.helpers import HEAD_CONTEXT_TURNS, TIMEOUT, assert_head_context_covers_every_token
from tests.core.serving.test_runner import ask

CLOSE = 1e-4  # chunked and one-pass reads differ by float32 noise


def ids_of(m, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(m.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True))


def hidden_of(m, tokens: list[int]) -> mx.array:
    """The target's post-norm hidden states of `tokens`, read in one pass into a fresh cache."""
    return m.model.language_model.model(mx.array(tokens)[None], cache=make_prompt_cache(m.model))


def reference(m, tokens: list[int], bonus: int):
    """mlx-vlm's own fill of the drafter's cache from the whole sequence (what its generate loop does once)."""
    drafter = m.mtp_head.drafter
    drafter.reset(m.model)
    drafter.prefill_from_target_hidden(mx.array(tokens)[None], hidden_of(m, tokens), bonus, None, greedy=True)
    return drafter


@pytest.fixture(scope="module")
def random_head(tiny_mtp, load_tiny):
    return load_tiny(tiny_mtp("moe", "random"))


def test_the_prompt_read_in_chunks_fills_the_heads_cache_as_mlx_vlm_does(random_head):
    m = random_head
    tokens = ids_of(m, "Tell me about the local model cache and its speed on apple silicon")
    context = HeadContext.new(m.mtp_head)
    read = prefill(m, make_prompt_cache(m.model), tokens, step=5, head=context)
    assert read == len(tokens)
    assert context.base == 0 and context.end == len(tokens) - 1 and context.carry[0] == len(tokens) - 1
    want = reference(m, tokens, bonus=7)._cache[0]  # entries 0..n-1: the last pairs the bonus token
    got = context.layers[0]
    n = len(tokens) - 1
    assert mx.abs(got.keys[..., :n, :] - want.keys[..., :n, :]).max().item() < CLOSE
    assert mx.abs(got.values[..., :n, :] - want.values[..., :n, :]).max().item() < CLOSE


def test_a_round_over_the_context_drafts_what_mlx_vlms_drafter_drafts(random_head):
    m = random_head
    tokens = ids_of(m, "one two three four five six seven eight nine ten")
    bonus = 11
    context = HeadContext.new(m.mtp_head)
    prefill(m, make_prompt_cache(m.model), tokens, step=4, head=context)
    context.lend()
    ours = m.mtp_head.drafter.draft_block(bonus, context.carry[1], None, 4, None, greedy=True)
    theirs = reference(m, tokens, bonus).draft_block(bonus, None, None, 4, None, greedy=True)
    assert ours.tolist() == theirs.tolist()
    assert context.end == len(tokens) - 1 + 3  # the round wrote its entries into the lent context


def test_a_gap_starts_the_context_again_and_a_rewind_goes_back_to_its_mark(random_head):
    m = random_head
    tokens = ids_of(m, "hello there, how are you today?")
    half = len(tokens) // 2
    prompt = PromptCache.new(m)
    context = prompt.head_context(m.mtp_head)
    prefill(m, prompt.layers, tokens[:half], head=context, held=0)
    prompt.extend(tokens[:half])
    mark = prompt.mark()
    prefill(m, prompt.layers, tokens[half:], head=context, held=half)
    prompt.extend(tokens[half:])
    assert context.end == len(tokens) - 1
    prompt.rewind(mark)
    assert context.end == half - 1 and context.carry[0] == half - 1  # the mark's hidden state came back
    prefill(m, prompt.layers, tokens[half:], head=context, held=half)
    assert context.base == 0 and context.end == len(tokens) - 1  # went on without a gap
    context.read(len(tokens) + 3, [5, 6], hidden_of(m, [5, 6]))  # three tokens read without it
    assert context.base == len(tokens) + 3 and context.end == len(tokens) + 4


def test_a_checkpoint_keeps_the_context_and_reading_on_never_writes_into_it(random_head):
    m = random_head
    tokens = ids_of(m, "Why is the sky blue?")
    prompt = PromptCache.new(m)
    prefill(m, prompt.layers, tokens, head=prompt.head_context(m.mtp_head))
    prompt.extend(tokens)
    checkpoint = prompt.save()
    place, head_layers = checkpoint.head_part
    assert place.base == 0 and sum(layer.nbytes for layer in head_layers) > 0
    assert all(a is b for a, b in zip(checkpoint.layers[-len(head_layers) :], head_layers))  # after the model's, in the one list
    kept = mx.array(head_layers[0].keys)
    restored = PromptCache.restore(checkpoint)
    context = restored.head_context(m.mtp_head)
    assert (context.base, context.end, context.carry[0]) == (0, len(tokens) - 1, len(tokens) - 1)
    more = [9, 10, 11]
    prefill(m, restored.layers, more, head=context, held=len(tokens))
    restored.extend(more)
    assert context.end == len(tokens) + len(more) - 1
    assert mx.array_equal(head_layers[0].keys, kept)
    again = PromptCache.restore(restored.save())  # a position of a restored cache that never asked for it
    assert again.save().head is not None and again.save().head.carry[0] == len(tokens) + len(more) - 1


def test_a_conversation_keeps_one_context_and_the_plain_replies(tiny_mtp):
    e = Engine()
    try:
        e.load(str(tiny_mtp("moe", "successor"))).result(timeout=TIMEOUT)
        plain = e.new_session(options=SessionOptions(mtp=MTPMode.OFF))
        fast = e.new_session(options=SessionOptions(mtp=MTPMode.ON))
        for turn in HEAD_CONTEXT_TURNS:
            a, b = turn(plain).result(timeout=TIMEOUT), turn(fast).result(timeout=TIMEOUT)
            assert (b.text, b.reasoning, b.token_ids) == (a.text, a.reasoning, a.token_ids)
            assert_head_context_covers_every_token(fast)
        assert plain._live.head is None  # MTP off keeps none
    finally:
        e.close()


@pytest.mark.parametrize("batching", [True, False])
def test_an_agent_loop_through_the_pool_keeps_the_heads_context_and_one_policy(tiny_mtp, batching):
    """Lone requests (the batch's solo path, or one at a time): each reads its prompt with the head's context, the
    pool's checkpoints keep it, and the next request of the loop goes on from there without a gap."""
    e = Engine()
    try:
        e.load(str(tiny_mtp("moe", "successor"))).result(timeout=TIMEOUT)
        on = ServingEngine(e, ServingOptions(session=SessionOptions(mtp=MTPMode.ON), batching=batching))
        off = ServingEngine(e, ServingOptions(session=SessionOptions(mtp=MTPMode.OFF), batching=batching))
        history = [ChatMessage(Role.SYSTEM, "You are a helpful agent."), ChatMessage(Role.USER, "What is in the folder?")]
        rounds = []
        for turn in range(3):
            fast, plain = on.submit(ask(*history, max_tokens=24)).wait(TIMEOUT), off.submit(ask(*history, max_tokens=24)).wait(TIMEOUT)
            assert (fast.text, fast.reasoning, fast.usage) == (plain.text, plain.reasoning, plain.usage)
            assert fast.mtp_tokens_per_step is not None and fast.mtp_tokens_per_step >= 1 and 0 <= fast.mtp_acceptance <= 1
            assert plain.mtp_tokens_per_step is None and plain.mtp_acceptance is None
            assert turn == 0 or fast.usage.cached_tokens > 0  # went on from a checkpoint of the last request
            rounds.append(on.mtp_policy_for(e.model).rounds)
            history += [ChatMessage(Role.ASSISTANT, fast.text or "ok"), ChatMessage(Role.USER, f"and then {turn}?")]
        assert rounds[0] > 0 and rounds[0] < rounds[1] < rounds[2]  # one policy measured every request
        heads = [c.head for c in on.pool._entries.values()]
        assert heads and all(h is not None for h in heads)
        longest = max(on.pool._entries.values(), key=lambda c: c.length)
        place, head_layers = longest.head_part
        assert place.base == 0 and head_layers[0].keys.shape[2] == longest.length - 1  # no gap since the start
    finally:
        e.close()


def test_after_a_drafting_reply_every_entry_is_the_one_a_whole_read_gives(tiny_mtp, load_tiny):
    """Rounds whose drafts were all rejected (a random head) leave only verified entries: each equals mlx-vlm's own
    fill over the whole conversation read in one pass, position for position (the round's given token is read into
    the head as a verified one before it drafts, so nothing lands a position early)."""
    m = load_tiny(tiny_mtp("dense", "random"))
    tokens = ids_of(m, "Why is the sky blue? Please think very carefully first.")
    prompt = PromptCache.new(m)
    context = prompt.head_context(m.mtp_head)
    prefill(m, prompt.layers, tokens[:-1], head=context)
    prompt.extend(tokens[:-1])
    policy = DepthPolicy(MTPMode.ON)
    streamed = stream_alone(
        m,
        prompt.layers,
        tokens[-1:],
        held=tokens[:-1],
        limit=4096,
        params=greedy(24),
        thinking=True,
        emit=lambda _event: None,
        clock=TurnClock(),
        mtp=MTPMode.ON,
        mtp_policy=policy,
        mtp_context=context,
    )
    stats = streamed.reply.stats
    assert stats.mtp_steps > 3 and stats.mtp_accepted == 0  # the random head's drafts: every one rejected
    held = [*tokens[:-1], *streamed.tokens_added]  # tokens_added begins with the prompt's last token
    assert context.base == 0 and context.end == len(held) - 1 and context.carry[0] == len(held) - 1
    want = reference(m, held, bonus=7)._cache[0]
    got = context.layers[0]
    n = len(held) - 1
    assert mx.abs(got.keys[..., :n, :] - want.keys[..., :n, :]).max().item() < CLOSE
    assert mx.abs(got.values[..., :n, :] - want.values[..., :n, :]).max().item() < CLOSE
