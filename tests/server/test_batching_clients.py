"""Many clients at once through the real SDKs: one batch on the engine, each reply what it would be alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor


from macapp.core.sampling import greedy
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL
from tests.server.conftest import GREEDY, no_eos_bias, serve

TIMEOUT = 120
ANTHROPIC_WEATHER = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


def openai_stream(served, i: int, thinking: bool, tools: bool) -> tuple:
    stream = served.openai().chat.completions.create(
        model="m",
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=40,
        messages=[{"role": "user", "content": f"Weather report number {i}, please."}],
        tools=[WEATHER_TOOL] if tools else None,
        extra_body={**GREEDY, "chat_template_kwargs": {"enable_thinking": thinking}},
    )
    text, reasoning, calls, usage, finish = [], [], {}, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            text.append(delta.content or "")
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            for call in delta.tool_calls or []:
                calls.setdefault(call.index, []).append(call.function.arguments or "")
            finish = choice.finish_reason or finish
    return "".join(text), "".join(reasoning), {k: "".join(v) for k, v in calls.items()}, usage, finish


def anthropic_stream(served, i: int, thinking: bool, tools: bool) -> tuple:
    kwargs = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if thinking else {}
    with served.anthropic().messages.stream(
        model="m",
        max_tokens=40,
        extra_body={"temperature": 0.0, "top_p": 1.0},
        messages=[{"role": "user", "content": f"Weather report number {i}, please."}],
        tools=[ANTHROPIC_WEATHER] if tools else [],
        **kwargs,
    ) as stream:
        message = stream.get_final_message()
    blocks = [(b.type, getattr(b, "text", None) or getattr(b, "thinking", None) or getattr(b, "input", None)) for b in message.content]
    return blocks, message.stop_reason, message.usage.output_tokens


CASES = [(api, thinking, tools) for api in ("openai", "anthropic") for thinking in (False, True) for tools in (False, True)]


def one(served, i: int, case: tuple) -> tuple:
    api, thinking, tools = case
    return (openai_stream if api == "openai" else anthropic_stream)(served, i, thinking, tools)


def test_eight_streams_at_once_each_equal_what_it_gets_alone(scripted_tool_model_path):
    with serve(scripted_tool_model_path) as served:
        alone = [one(served, i, case) for i, case in enumerate(CASES)]
        gate = threading.Event()
        held = served.engine.submit("hold", lambda job: gate.wait(TIMEOUT))  # all eight queue, then start together
        with ThreadPoolExecutor(len(CASES)) as pool:
            futures = [pool.submit(one, served, i, case) for i, case in enumerate(CASES)]
            deadline = time.monotonic() + 30
            while served.backend.pending < len(CASES) and time.monotonic() < deadline:
                time.sleep(0.02)
            gate.set()
            together = [f.result(TIMEOUT) for f in futures]
        held.join(TIMEOUT)
        assert served.backend.batch.peak == len(CASES)
    assert together == alone
    for (api, _thinking, tools), result in zip(CASES, together):
        if api == "openai" and tools:
            text, _reasoning, calls, _usage, finish = result
            assert text == TOOL_PREAMBLE and finish == "tool_calls" and '"Paris"' in calls[0]
        if api == "anthropic" and tools:
            blocks, stop, _ = result
            assert stop == "tool_use" and blocks[-1] == ("tool_use", TOOL_CALL_ARGUMENTS)


def test_a_client_that_hangs_up_leaves_the_batch_and_the_others_go_on(tiny_dense_path):
    with serve(tiny_dense_path) as served:
        endless = {**GREEDY, "logit_bias": no_eos_bias(served)}

        def long_reply(i: int) -> str:
            reply = served.openai().chat.completions.create(
                model="m",
                max_tokens=150,
                messages=[{"role": "user", "content": f"Story {i}"}],
                extra_body=endless,
            )
            return reply.choices[0].message.content

        def hang_up() -> int:
            stream = served.openai().chat.completions.create(
                model="m",
                max_tokens=5000,
                stream=True,
                messages=[{"role": "user", "content": "Endless"}],
                extra_body=endless,
            )
            seen = 0
            for chunk in stream:
                seen += 1
                if seen == 10:
                    stream.close()  # the client goes away mid-reply
                    return seen
            return seen

        alone = [long_reply(i) for i in range(3)]
        with ThreadPoolExecutor(4) as pool:
            quitter = pool.submit(hang_up)
            others = [pool.submit(long_reply, i) for i in range(3)]
            assert quitter.result(TIMEOUT) == 10
            left_at = time.monotonic()
            while served.backend.batch.active > 3 and time.monotonic() - left_at < TIMEOUT:
                time.sleep(0.01)
            assert served.backend.batch.active <= 3  # it left while the others were still decoding
            assert [f.result(TIMEOUT) for f in others] == alone
        record = next(r for r in served.activity.records() if r.prompt_tokens and r.completion_tokens < 100 and r.state.finished)
        assert record.completion_tokens < 5000


def test_a_window_chat_and_three_api_clients_at_once(tiny_dense_path):
    from macapp.core.demo.tiny_model import SCRIPT_ANSWER

    with serve(tiny_dense_path) as served:
        session = served.engine.new_session()
        gate = threading.Event()
        held = served.engine.submit("hold", lambda job: gate.wait(TIMEOUT))  # all four start together
        with ThreadPoolExecutor(3) as pool:
            replies = [pool.submit(openai_stream, served, i, False, False) for i in range(3)]
            while served.backend.pending < 3:
                time.sleep(0.02)
            chat = session.send("Hello from the window", thinking=False, sampling=greedy(30))
            gate.set()
            held.join(TIMEOUT)
            assert chat.result(TIMEOUT).text == "".join(SCRIPT_ANSWER)
            results = [f.result(TIMEOUT) for f in replies]
        assert served.backend.batch.peak == 4  # the window's chat was one more sequence of the batch
        assert all(r[0] == "".join(SCRIPT_ANSWER) and r[4] == "stop" for r in results)
