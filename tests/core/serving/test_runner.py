"""The runner end to end on tiny real models: text, reasoning, tool calls, usage, checkpoints, stops, queue."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from macapp.core import events as ev
from macapp.core.engine import SessionOptions
from macapp.core.events import AnswerDelta, Failed, PromptProgress, ReasoningDelta
from macapp.core.sampling import greedy
from macapp.core.serving.render import render
from macapp.core.serving.requests import (
    INVALID_REQUEST,
    ChatMessage,
    Completed,
    CompletionRequest,
    FinishReason,
    RequestStarted,
    Role,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from macapp.core.serving.runner import QueueFull, ServingEngine, ServingOptions
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.core.serving.conftest import TIMEOUT
from tests.fixtures.scripted import (
    MALFORMED_TEXT,
    TIME_TOOL,
    TOOL_CALL_ANSWER,
    TOOL_CALL_ARGUMENTS,
    TOOL_PREAMBLE,
    TWO_CALLS,
    WEATHER_TOOL,
)

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
WEATHER = ToolSpec(WEATHER_TOOL["function"]["name"], WEATHER_TOOL["function"]["description"], WEATHER_TOOL["function"]["parameters"])
TIME = ToolSpec(TIME_TOOL["function"]["name"], "", TIME_TOOL["function"]["parameters"])
SYSTEM = ChatMessage(Role.SYSTEM, "You are an agent with tools. Think, then call a tool when it helps. " * 8)
USER = ChatMessage(Role.USER, "What is the weather in Paris?")


def ask(*messages: ChatMessage, max_tokens: int = 60, **kw) -> CompletionRequest:
    return CompletionRequest(messages=tuple(messages), sampling=kw.pop("sampling", greedy(max_tokens)), **kw)


def run(serving: ServingEngine, request: CompletionRequest) -> tuple[list, Completed | Failed]:
    events = list(serving.submit(request).events(timeout=TIMEOUT))
    return events, events[-1]


def off_script(engine, max_tokens: int = 40):
    """Greedy with the end-of-turn tokens banned: long text that depends on the whole context."""
    vocab = engine.model.tokenizer.get_vocab()
    return greedy(max_tokens, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})


@pytest.fixture
def tiny(load, tiny_moe_path):
    return ServingEngine(load(tiny_moe_path))


@pytest.fixture
def tool_model(load, scripted_tool_model_path):
    return ServingEngine(load(scripted_tool_model_path))


@pytest.mark.parametrize("thinking", [False, True])
def test_text_and_reasoning_stream_and_complete_with_usage(tiny, thinking):
    events, done = run(tiny, ask(SYSTEM, USER, thinking=thinking))
    assert isinstance(done, Completed), done
    assert done.text == ANSWER and done.finish_reason is FinishReason.STOP and done.tool_calls == ()
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == ANSWER
    assert done.reasoning == (REASONING if thinking else "")
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == done.reasoning
    prompt = tiny.count_tokens(ask(SYSTEM, USER, thinking=thinking))
    assert done.usage.prompt_tokens == prompt and done.usage.completion_tokens == len(SCRIPT_ANSWER) + 1 + (
        len(SCRIPT_REASONING) + 2 if thinking else 0
    )  # eos counted like mlx-lm; with thinking also </think> and the blank line
    assert done.model == tiny.model_name and done.ttft_s > 0
    assert events[0] == RequestStarted(prompt, 0) and isinstance(events[1], PromptProgress)


def test_thinking_budget_closes_the_reasoning(tiny):
    _, done = run(tiny, ask(USER, thinking=True, thinking_budget=3))
    assert done.reasoning == "".join(SCRIPT_REASONING[:3]) and done.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("thinking", [False, True])
def test_a_tool_call_comes_out_parsed_with_typed_arguments(tool_model, thinking):
    events, done = run(tool_model, ask(SYSTEM, USER, tools=(WEATHER,), thinking=thinking))
    assert done.finish_reason is FinishReason.TOOL_CALLS and done.text == TOOL_PREAMBLE
    (call,) = done.tool_calls
    assert (call.name, call.arguments) == ("get_weather", TOOL_CALL_ARGUMENTS) and call.id.startswith("call_")
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [(e.index, e.id, e.name) for e in started] == [(0, call.id, "get_weather")] and finished[0].call == call
    answer = "".join(e.text for e in events if isinstance(e, AnswerDelta))
    assert answer == TOOL_PREAMBLE and "<" not in answer
    assert events.index(started[0]) > max(i for i, e in enumerate(events) if isinstance(e, AnswerDelta))


def test_without_tools_offered_the_markup_is_plain_text(tool_model):
    _, done = run(tool_model, ask(USER, tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.NONE)))
    assert done.tool_calls == () and "<tool_call>" in done.text and done.finish_reason is FinishReason.STOP


def test_several_calls_in_one_reply(load, scripted_two_calls_path):
    serving = ServingEngine(load(scripted_two_calls_path))
    events, done = run(serving, ask(USER, tools=(WEATHER, TIME)))
    assert [(c.name, c.arguments) for c in done.tool_calls] == TWO_CALLS and done.text == ""
    assert [e.index for e in events if isinstance(e, ToolCallFinished)] == [0, 1, 2]
    assert len({c.id for c in done.tool_calls}) == 3


def test_a_malformed_call_comes_back_as_text(load, scripted_malformed_path):
    serving = ServingEngine(load(scripted_malformed_path))
    events, done = run(serving, ask(USER, tools=(WEATHER,)))
    assert done.tool_calls == () and done.text == MALFORMED_TEXT and done.finish_reason is FinishReason.STOP
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == MALFORMED_TEXT


def longest_shared_boundary(previous, current) -> int:
    return max((b for b in previous.boundaries if current.tokens[:b] == previous.tokens[:b]), default=0)


@pytest.mark.parametrize("thinking", [False, True])
def test_an_agent_loop_reads_only_the_new_tail(tool_model, engine, thinking):
    tok = engine.model.tokenizer
    messages = [SYSTEM, USER]
    rounds = []
    for i in range(4):
        request = ask(*messages, tools=(WEATHER,), thinking=thinking)
        rendered = render(tok, request)
        events, done = run(tool_model, request)
        assert done.finish_reason is FinishReason.TOOL_CALLS, done
        assert done.usage.prompt_tokens == len(rendered.tokens)
        # the split is known before any of the prompt is read: the job's first event says it
        assert events[0] == RequestStarted(done.usage.prompt_tokens, done.usage.cached_tokens, "memory" if rounds else "")
        assert isinstance(events[1], PromptProgress) and events[1].total == done.usage.read_tokens
        if rounds:
            before_reply = rounds[-1].boundaries[-2]  # where the previous reply started
            assert done.usage.cached_tokens == longest_shared_boundary(rounds[-1], rendered) >= before_reply
            tail = len(rendered.tokens) - before_reply  # the previous reply as rendered, the result, the prompt
            assert done.usage.read_tokens <= tail and done.usage.read_tokens < len(rendered.tokens) // 2
        else:
            assert done.usage.cached_tokens == 0
        rounds.append(rendered)
        messages += [
            ChatMessage(Role.ASSISTANT, done.text, tool_calls=done.tool_calls),
            ChatMessage(Role.TOOL, f"Sunny, {20 + i} degrees.", tool_call_id=done.tool_calls[0].id),
        ]
    # A new user turn: the template re-renders the loop's replies, so everything after the last user query is
    # read again, and only that: the checkpoint before the loop's first reply is still in the pool.
    messages += [ChatMessage(Role.ASSISTANT, "It is sunny."), ChatMessage(Role.USER, "And tomorrow?")]
    _, done = run(tool_model, ask(*messages, tools=(WEATHER,), thinking=thinking))
    assert done.usage.cached_tokens == rounds[0].boundaries[-2]


def test_the_same_greedy_text_with_and_without_checkpoints(load, tiny_moe_path):
    engine = load(tiny_moe_path)
    pooled = ServingEngine(engine)
    unpooled = ServingEngine(engine, ServingOptions(pool_bytes=1))  # nothing fits: every prompt read afresh
    sampling = off_script(engine)
    messages = [SYSTEM, USER]
    for i in range(3):
        request = ask(*messages, sampling=sampling)
        _, a = run(pooled, request)
        _, b = run(unpooled, request)
        assert b.usage.cached_tokens == 0 and (i == 0 or a.usage.cached_tokens > 0)
        assert a.text == b.text and len(a.text) > 20
        messages += [ChatMessage(Role.ASSISTANT, a.text[:30]), ChatMessage(Role.USER, f"Go on ({i}).")]


def test_a_stop_sequence_ends_the_reply_before_it(tiny):
    events, done = run(tiny, ask(USER, stop=(" is", "!")))
    assert done.text == "The answer" and done.stop_sequence == " is" and done.finish_reason is FinishReason.STOP_SEQUENCE
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == "The answer"
    assert done.usage.completion_tokens == 3  # stopped at the token that completed the match


def test_max_tokens_is_clamped_to_the_room_in_the_context(load, tiny_moe_path):
    engine = load(tiny_moe_path)
    prompt = ServingEngine(engine).count_tokens(ask(USER))
    serving = ServingEngine(engine, ServingOptions(session=SessionOptions(context_limit=prompt + 2)))
    _, done = run(serving, ask(USER, max_tokens=500))
    assert done.finish_reason is FinishReason.LENGTH and done.usage.completion_tokens == 2
    events, failed = run(ServingEngine(engine, ServingOptions(session=SessionOptions(context_limit=prompt))), ask(USER))
    assert isinstance(failed, Failed) and failed.code == ev.CONTEXT_LIMIT and events == [failed]


def test_bad_requests_fail_clearly_before_any_work(tiny):
    events, failed = run(tiny, ask(USER, tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "nope")))
    assert isinstance(failed, Failed) and failed.code == INVALID_REQUEST and "nope" in failed.message and events == [failed]
    _, failed = run(tiny, ask(USER, sampling=greedy(10, top_p=0.0)))
    assert isinstance(failed, Failed) and "top_p" in failed.message


def test_stop_ends_a_running_reply_within_a_few_tokens_and_the_next_starts(tiny, engine):
    job = tiny.submit(ask(USER, sampling=off_script(engine, 5000)))
    seen = 0
    for event in job.events(timeout=TIMEOUT):
        if isinstance(event, AnswerDelta):
            seen += 1
            job.stop()
    done = event
    assert isinstance(done, Completed) and done.finish_reason is FinishReason.CANCELLED
    assert done.usage.completion_tokens < 200
    _, after = run(tiny, ask(USER))
    assert after.text == ANSWER


def test_a_request_stopped_while_queued_never_runs_and_the_queue_is_bounded(load, tiny_moe_path):
    """One in the batch (--parallel 1), one more may wait; the next is refused."""
    engine = load(tiny_moe_path)
    serving = ServingEngine(engine, ServingOptions(queue_limit=1, parallel=1))
    gate = threading.Event()
    blocker = engine.submit("test-block", lambda job: gate.wait(TIMEOUT))
    first = serving.submit(ask(USER))
    second = serving.submit(ask(USER))
    with pytest.raises(QueueFull) as full:
        serving.submit(ask(USER))
    assert full.value.retry_after_s > 0 and "busy" in str(full.value)
    second.stop()
    gate.set()
    blocker.join(TIMEOUT)
    assert first.wait(TIMEOUT).text == ANSWER
    cancelled = second.wait(TIMEOUT)
    assert cancelled.finish_reason is FinishReason.CANCELLED and cancelled.usage.prompt_tokens == 0
    assert serving.pending == 0
    assert run(serving, ask(USER))[1].text == ANSWER


def test_chat_sessions_keep_their_own_cache_while_requests_are_served(tiny, engine):
    session = engine.new_session()
    assert session.send("Hello", thinking=False, sampling=greedy(20)).result(TIMEOUT).text == ANSWER
    before = session.context_tokens
    assert run(tiny, ask(SYSTEM, USER))[1].text == ANSWER
    reply = session.send("Again", thinking=False, sampling=greedy(20)).result(TIMEOUT)
    assert reply.text == ANSWER and reply.stats.prompt_tokens < before and session.context_tokens > before


def test_no_model_fails_with_its_code():
    from macapp.core.engine import Engine

    e = Engine()
    try:
        _, failed = run(ServingEngine(e), ask(USER))
        assert isinstance(failed, Failed) and failed.code == ev.NO_MODEL
    finally:
        e.close()


def test_a_forced_call_parses_what_the_model_writes_after_the_prefill(engine, load, tiny_moe_path):
    """The prompt wrote the call's opening: the reply text goes on inside it (real Job, real render)."""
    from macapp.core.engine import Job
    from macapp.core.serving.reply_text import ReplyText as _ReplyText

    load(tiny_moe_path)
    request = ask(USER, tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
    job = Job("test")
    text = _ReplyText(job, render(engine.model.tokenizer, request), request)
    text.emit(AnswerDelta("get_weather>\n<parameter=city>\nParis\n</parameter>\n"))
    text.emit(AnswerDelta("</function>\n</tool_call>"))
    assert text.finish("stop") is FinishReason.TOOL_CALLS and text.text == ""
    assert [(c.name, c.arguments) for c in text.calls] == [("get_weather", {"city": "Paris"})]
    assert [type(e) for e in job.history] == [ToolCallStarted, ToolCallFinished]


def test_at_most_one_call_ends_the_reply_after_the_first(engine, load, tiny_moe_path):
    """ToolChoice.parallel off: the other calls of the block are not the reply, generation is asked to stop."""
    from macapp.core.engine import Job
    from macapp.core.serving.reply_text import ReplyText as _ReplyText

    load(tiny_moe_path)
    request = ask(USER, tools=(WEATHER,), tool_choice=ToolChoice(parallel=False))
    text = _ReplyText(Job("test"), render(engine.model.tokenizer, request), request)
    assert not text.should_stop()
    text.emit(AnswerDelta("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"))
    text.emit(AnswerDelta("<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"))
    assert text.should_stop()
    assert text.finish("stopped") is FinishReason.TOOL_CALLS
    assert [c.arguments for c in text.calls] == [{"city": "Paris"}]


@pytest.mark.parametrize("choice", [ToolChoice(ToolChoiceMode.REQUIRED), ToolChoice(ToolChoiceMode.FUNCTION, "get_weather")])
def test_a_forced_call_the_model_botches_comes_back_as_text_with_its_opening(tool_model, choice):
    """The scripted model does not follow the prefill (its script starts elsewhere): nothing is lost."""
    _, done = run(tool_model, ask(USER, tools=(WEATHER,), thinking=True, tool_choice=choice, max_tokens=40))
    assert isinstance(done, Completed) and done.reasoning == ""  # a forced call is written without reasoning
    assert done.tool_calls == () and done.finish_reason is FinishReason.STOP
    assert done.text.startswith("<tool_call>\n<function=") and done.text.endswith(TOOL_CALL_ANSWER[-1])


def test_four_clients_at_once_all_get_complete_answers(tool_model):
    results: dict[int, Completed] = {}

    def client(i: int) -> None:
        request = ask(SYSTEM, ChatMessage(Role.USER, f"Weather number {i}?"), tools=(WEATHER,), thinking=i % 2 == 1)
        results[i] = tool_model.submit(request).wait(TIMEOUT)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(results) == [0, 1, 2, 3]
    for i, done in results.items():
        assert done.finish_reason is FinishReason.TOOL_CALLS and done.text == TOOL_PREAMBLE
        assert done.tool_calls[0].arguments == TOOL_CALL_ARGUMENTS and done.reasoning == (REASONING if i % 2 else "")
    assert tool_model.pending == 0


def test_stop_while_reading_the_prompt_ends_at_once_and_keeps_the_checkpoints_passed(load, tiny_moe_path):
    engine = load(tiny_moe_path)
    serving = ServingEngine(engine, ServingOptions(session=SessionOptions(prefill_step_size=4)))
    request = ask(ChatMessage(Role.SYSTEM, "Be brief."), ChatMessage(Role.USER, "Read all of this first. " * 50))
    after_system = render(engine.model.tokenizer, request).boundaries[0]
    job = serving.submit(request)
    for event in job.events(timeout=TIMEOUT):
        if isinstance(event, PromptProgress) and event.processed > after_system and not job.stopped:
            job.stop()
    done = event
    assert isinstance(done, Completed) and done.finish_reason is FinishReason.CANCELLED
    assert done.usage.completion_tokens == 0 and done.text == ""
    # the system prompt's checkpoint was passed before the stop: the retry starts there
    _, again = run(serving, request)
    assert again.text == ANSWER and again.usage.cached_tokens == after_system


def test_loading_another_model_frees_the_checkpoints_first(load, tiny_moe_path, tiny_dense_path):
    engine = load(tiny_moe_path)
    serving = ServingEngine(engine)
    run(serving, ask(SYSTEM, USER))
    assert len(serving.pool) > 0 and serving.pool.nbytes > 0
    load(tiny_dense_path)
    assert len(serving.pool) == 0 and serving.pool.nbytes == 0
    _, done = run(serving, ask(SYSTEM, USER))
    assert done.usage.cached_tokens == 0 and done.text == ANSWER and done.model == "tiny-qwen3.5-dense"


def test_quantized_kv_checkpoints_restore_and_reply_like_a_fresh_read(load, tiny_moe_path):
    engine = load(tiny_moe_path)
    options = ServingOptions(session=SessionOptions(kv_bits=8))
    pooled, unpooled = ServingEngine(engine, options), ServingEngine(engine, replace(options, pool_bytes=1))
    sampling = off_script(engine)
    messages = [SYSTEM, USER]
    for i in range(2):
        _, a = run(pooled, ask(*messages, sampling=sampling))
        _, b = run(unpooled, ask(*messages, sampling=sampling))
        assert a.text == b.text and (i == 0 or a.usage.cached_tokens > 0) and b.usage.cached_tokens == 0
        messages += [ChatMessage(Role.ASSISTANT, a.text[:30]), ChatMessage(Role.USER, "More.")]


def test_the_pool_is_a_share_of_the_memory_the_weights_leave(load, tiny_moe_path):
    """Sized from the sizing model's memory budget on the first request (a quarter of budget - weights, with a floor)."""
    from macapp.core.serving.runner import MIN_POOL_BYTES, POOL_SHARE

    engine = load(tiny_moe_path)
    weights = engine.model.weights_bytes
    roomy = ServingEngine(engine, ServingOptions(session=SessionOptions(memory_budget_bytes=weights + 8 * 1024**3)))
    tight = ServingEngine(engine, ServingOptions(session=SessionOptions(memory_budget_bytes=weights + 900 * 1024**2)))
    for serving in (roomy, tight):
        _, done = run(serving, ask(USER))
        assert isinstance(done, Completed), done
    assert roomy.pool.max_bytes == int(8 * 1024**3 * POOL_SHARE) and roomy.pool.nbytes > 0
    assert tight.pool.max_bytes == MIN_POOL_BYTES
