"""Requests in one batch (ServingEngine.sequence on engine/batch.py): the same replies as alone, each with its
own settings, stops and checkpoints, while the rest of the batch goes on."""

from __future__ import annotations

import threading

import pytest

from macapp.core.events import AnswerDelta, Finished
from macapp.core.sampling import SamplingParams, greedy
from macapp.core.serving.render import render
from macapp.core.serving.requests import ChatMessage, Completed, FinishReason, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.core.serving.conftest import TIMEOUT
from tests.core.serving.test_runner import ANSWER, SYSTEM, USER, WEATHER, ask, longest_shared_boundary, off_script
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE

QUESTIONS = [f"Question {i}: " + "tell me more " * (i * 3) for i in range(6)]


def all_at_once(serving: ServingEngine, requests: list) -> list[Completed]:
    """Submit every request before any has started (the worker held), then let them run together (the batch's
    `peak` then counts this run's sequences: the engine's batch outlives each test's ServingEngine)."""
    serving.batch.peak = 0
    gate = threading.Event()
    held = serving.engine.submit("hold", lambda job: gate.wait(TIMEOUT))
    jobs = [serving.submit(r) for r in requests]
    gate.set()
    held.join(TIMEOUT)
    return [job.wait(TIMEOUT) for job in jobs]


def one_by_one(serving: ServingEngine, requests: list) -> list[Completed]:
    return [serving.submit(r).wait(TIMEOUT) for r in requests]


@pytest.fixture
def moe(load, tiny_moe_path):
    return load(tiny_moe_path)


def test_a_batch_of_six_gives_each_the_text_it_gets_alone_and_the_one_at_a_time_path_agrees(moe):
    requests = [ask(SYSTEM, ChatMessage(Role.USER, q), sampling=off_script(moe, 24 + 4 * i)) for i, q in enumerate(QUESTIONS)]
    batched = ServingEngine(moe, ServingOptions(pool_bytes=0))
    together = all_at_once(batched, requests)
    assert batched.batch.peak == len(requests)  # they really ran together
    alone = one_by_one(ServingEngine(moe, ServingOptions(pool_bytes=0)), requests)
    sequential = one_by_one(ServingEngine(moe, ServingOptions(pool_bytes=0, batching=False)), requests)
    for i, (a, b, c) in enumerate(zip(together, alone, sequential)):
        assert a.finish_reason is b.finish_reason is c.finish_reason is FinishReason.LENGTH, i
        assert a.text == b.text == c.text and a.text, i
        assert a.usage == b.usage == c.usage and a.usage.completion_tokens == 24 + 4 * i, i


def test_each_sequence_keeps_its_own_mode_budget_and_max_tokens(moe):
    serving = ServingEngine(moe)
    requests = [
        ask(USER, thinking=True),
        ask(USER, thinking=True, thinking_budget=3),
        ask(USER, thinking=False),
        ask(USER, thinking=False, max_tokens=2),
    ]
    full, budget, plain, short = all_at_once(serving, requests)
    assert full.reasoning == "".join(SCRIPT_REASONING) and full.text == ANSWER
    assert budget.reasoning == "".join(SCRIPT_REASONING[:3]) and budget.text == ANSWER and budget.finish_reason is FinishReason.STOP
    assert plain.reasoning == "" and plain.text == ANSWER
    assert short.text == "".join(SCRIPT_ANSWER[:2]) and short.finish_reason is FinishReason.LENGTH
    assert short.usage.completion_tokens == 2


def test_a_stopped_sequence_leaves_within_a_token_and_the_others_finish(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    long = [ask(ChatMessage(Role.USER, q), sampling=off_script(moe, 200)) for q in QUESTIONS[:3]]
    jobs = [serving.submit(r) for r in long]
    victim = jobs[1]
    texts: list[str] = []

    def on_event(event) -> None:
        if isinstance(event, AnswerDelta):
            texts.append(event.text)
            if len(texts) == 5:
                victim.stop()

    victim.add_listener(on_event)
    stopped = victim.wait(TIMEOUT)
    assert stopped.finish_reason is FinishReason.CANCELLED
    assert stopped.usage.completion_tokens <= 5 + 2  # the token in flight, and the one after the stop was seen
    others = [jobs[0].wait(TIMEOUT), jobs[2].wait(TIMEOUT)]
    assert all(d.finish_reason is FinishReason.LENGTH and d.usage.completion_tokens == 200 for d in others)
    alone = one_by_one(ServingEngine(moe, ServingOptions(pool_bytes=0)), [long[0], long[2]])
    assert [d.text for d in others] == [d.text for d in alone]


def test_four_agent_loops_at_once_each_read_only_their_new_tail(load, scripted_tool_model_path):
    engine = load(scripted_tool_model_path)
    serving = ServingEngine(engine)
    tok = engine.model.tokenizer
    loops = [[SYSTEM, ChatMessage(Role.USER, f"Weather in city {i}?")] for i in range(4)]
    previous: list = [None] * 4
    for _round in range(3):
        requests = [ask(*messages, tools=(WEATHER,)) for messages in loops]
        done = all_at_once(serving, requests)
        for i, (request, reply) in enumerate(zip(requests, done)):
            rendered = render(tok, request)
            assert reply.finish_reason is FinishReason.TOOL_CALLS and reply.text == TOOL_PREAMBLE, reply
            assert reply.tool_calls[0].arguments == TOOL_CALL_ARGUMENTS
            if previous[i] is not None:
                assert reply.usage.cached_tokens == longest_shared_boundary(previous[i], rendered) > 0
                assert reply.usage.read_tokens < len(rendered.tokens) - previous[i].boundaries[-2]
            previous[i] = rendered
            call = reply.tool_calls[0]
            loops[i] = [
                *loops[i],
                ChatMessage(Role.ASSISTANT, reply.text, tool_calls=(call,)),
                ChatMessage(Role.TOOL, f"Sunny in city {i}.", tool_call_id=call.id, name=call.name),
            ]
    assert serving.batch.peak == 4


def test_a_seeded_request_gives_the_same_sample_beside_a_busy_batch(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    seeded = ask(USER, sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=30, seed=1234))
    alone = serving.submit(seeded).wait(TIMEOUT)
    neighbours = [ask(ChatMessage(Role.USER, q), sampling=off_script(moe, 60)) for q in QUESTIONS[:3]]
    results = all_at_once(serving, [*neighbours, seeded, *neighbours])
    assert serving.batch.peak == 7  # the seeded one decoded in the batch, beside the six others
    assert results[3].text == alone.text and results[3].usage == alone.usage
    assert all(r.finish_reason is FinishReason.LENGTH for r in results[:3] + results[4:])
    sequential = ServingEngine(moe, ServingOptions(pool_bytes=0, batching=False)).submit(seeded).wait(TIMEOUT)
    assert sequential.text == alone.text  # the one-at-a-time path samples from the same key


def test_a_seeded_request_is_answered_while_a_long_reply_streams(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    long = serving.submit(ask(ChatMessage(Role.USER, QUESTIONS[2]), sampling=off_script(moe, 400)))
    streaming = threading.Event()
    long.add_listener(lambda e: streaming.set() if isinstance(e, AnswerDelta) else None)
    assert streaming.wait(TIMEOUT)
    seeded = ask(USER, sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=20, seed=99))
    done = serving.submit(seeded).wait(TIMEOUT)
    assert not any(isinstance(e, Completed) for e in long.history)  # answered beside it, not after it
    assert done.usage.completion_tokens > 0
    assert long.wait(TIMEOUT).usage.completion_tokens == 400
    assert serving.submit(seeded).wait(TIMEOUT).text == done.text  # and the same reply alone


def test_a_turn_that_cannot_share_the_batch_runs_at_once_while_the_batch_waits(moe):
    """A turn on a quantized KV cache cannot share a batch of plain ones: it runs alone at once, the long reply waiting
    (not the other way round); a request after it then joins the long reply's batch."""
    from macapp.core.engine import SessionOptions

    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    session = moe.new_session(options=SessionOptions(kv_bits=8))
    order: list[str] = []
    first = serving.submit(ask(USER, sampling=off_script(moe, 3000)))
    first.add_listener(lambda e: order.append("api-1") if isinstance(e, Completed) else None)
    while not first.history or not any(isinstance(e, AnswerDelta) for e in first.history):
        threading.Event().wait(0.01)
    turn = session.send("Hello there", thinking=False, sampling=greedy(8))
    later = serving.submit(ask(USER, sampling=greedy(8)))
    turn.add_listener(lambda e: order.append("chat") if isinstance(e, Finished) else None)
    later.add_listener(lambda e: order.append("api-2") if isinstance(e, Completed) else None)
    assert turn.result(TIMEOUT).text and later.wait(TIMEOUT).text == ANSWER
    first.stop()
    first.wait(TIMEOUT)
    assert order == ["chat", "api-2", "api-1"]
    serving.close()


def test_the_batch_limit_comes_from_the_memory_that_is_left_and_parallel_lowers_it(moe):
    from macapp.core.fit import estimate

    roomy = ServingEngine(moe, ServingOptions(pool_bytes=0))
    assert roomy.batch_limit == 32  # a tiny model: the cap, mlx-lm's server default
    assert ServingEngine(moe, ServingOptions(pool_bytes=0, parallel=3)).batch_limit == 3
    m = moe.model
    per = estimate.kv_cache_bytes(m.arch, roomy.context_limit) + estimate.state_bytes(m.arch)
    fixed = m.weights_bytes + estimate.runtime_bytes(m.weights_bytes) + estimate.prefill_bytes(m.arch, roomy.context_limit)
    from macapp.core.engine import SessionOptions

    tight = ServingEngine(moe, ServingOptions(pool_bytes=0, session=SessionOptions(memory_budget_bytes=fixed + 5 * per + 1)))
    assert tight.batch_limit == 5


def test_usage_counts_the_reasoning_tokens_batched_and_alone(moe):
    batched = all_at_once(ServingEngine(moe), [ask(USER, thinking=True), ask(USER, thinking=False)])
    sequential = one_by_one(ServingEngine(moe, ServingOptions(batching=False)), [ask(USER, thinking=True)])
    assert batched[0].usage.reasoning_tokens == sequential[0].usage.reasoning_tokens >= len(SCRIPT_REASONING)
    assert batched[1].usage.reasoning_tokens == 0


def test_8_bit_kv_replies_batched_equal_the_same_alone(moe):
    from macapp.core.engine import SessionOptions

    options = ServingOptions(pool_bytes=0, session=SessionOptions(kv_bits=8))
    requests = [ask(SYSTEM, ChatMessage(Role.USER, q), sampling=off_script(moe, 24 + 4 * i)) for i, q in enumerate(QUESTIONS[:4])]
    batched = ServingEngine(moe, options)
    together = all_at_once(batched, requests)
    assert batched.batch.peak == len(requests)  # they really ran together, on a quantized cache
    alone = one_by_one(ServingEngine(moe, options), requests)
    for i, (a, b) in enumerate(zip(together, alone)):
        assert a.finish_reason is b.finish_reason is FinishReason.LENGTH, i
        assert a.text == b.text and a.text and a.usage == b.usage, i
    batched.close()


def test_a_request_to_a_kv_8_server_is_answered_while_a_long_reply_streams(moe):
    from macapp.core.engine import SessionOptions

    serving = ServingEngine(moe, ServingOptions(session=SessionOptions(kv_bits=8)))
    long = serving.submit(ask(ChatMessage(Role.USER, QUESTIONS[2]), sampling=off_script(moe, 400)))
    streaming = threading.Event()
    long.add_listener(lambda e: streaming.set() if isinstance(e, AnswerDelta) else None)
    assert streaming.wait(TIMEOUT)
    done = serving.submit(ask(USER, thinking=False)).wait(TIMEOUT)
    assert not any(isinstance(e, Completed) for e in long.history)  # answered beside it, not after it
    assert done.text == ANSWER
    assert long.wait(TIMEOUT).usage.completion_tokens == 400
    kept = list(serving.pool._entries.values())  # the batch's checkpoints: its cache was quantized
    assert kept and all(buf.quantization == (64, 8) for c in kept for buf in c.kv.layers)
    again = serving.submit(ask(USER, thinking=False)).wait(TIMEOUT)  # from the pool's quantized checkpoints
    assert again.text == ANSWER and again.usage.cached_tokens > 0
    serving.close()
