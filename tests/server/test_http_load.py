"""One engine, several clients: four at once all complete correctly; a full queue answers 429 with Retry-After;
a client that disconnects mid-stream stops its generation within about a second and the next starts at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai

from macapp.core.demo.tiny_model import SCRIPT_ANSWER
from macapp.server.activity import RequestState
from tests.server.conftest import no_eos_bias, serve

ANSWER = "".join(SCRIPT_ANSWER)


def endless(served, **extra):
    """A request that would generate until the context is full (eos banned, greedy)."""
    return {
        "model": "x",
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "temperature": 0,
        "max_tokens": 100_000,
        "logit_bias": no_eos_bias(served),
        "chat_template_kwargs": {"enable_thinking": False},
        **extra,
    }


def wait_for(predicate, timeout: float, what: str) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.01)
    return time.perf_counter() - start


def test_four_concurrent_clients_all_complete_correctly(tiny_server):
    def ask_openai(i: int) -> str:
        reply = tiny_server.openai().chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": f"Question number {i}"}],
            max_tokens=64,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        return reply.choices[0].message.content

    def ask_anthropic(i: int) -> str:
        message = tiny_server.anthropic().messages.create(
            model="m", max_tokens=64, extra_body={"temperature": 0}, messages=[{"role": "user", "content": f"Question number {i}"}]
        )
        return message.content[0].text

    def stream_openai(i: int) -> str:
        stream = tiny_server.openai().chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": f"Question number {i}"}],
            max_tokens=64,
            temperature=0,
            stream=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def stream_anthropic(i: int) -> str:
        with tiny_server.anthropic().messages.stream(
            model="m", max_tokens=64, extra_body={"temperature": 0}, messages=[{"role": "user", "content": f"Question number {i}"}]
        ) as stream:
            return stream.get_final_message().content[0].text

    clients = [ask_anthropic, ask_openai, stream_anthropic, stream_openai]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(ask, i) for i, ask in enumerate(clients)]
        answers = [f.result(timeout=120) for f in futures]
    assert answers == [ANSWER] * 4


def test_disconnect_mid_stream_stops_the_generation_and_the_next_request_starts_at_once(tiny_server):
    before = {r.id for r in tiny_server.activity.records()}
    with httpx2.stream("POST", f"{tiny_server.url}/v1/chat/completions", json=endless(tiny_server, stream=True), timeout=60) as response:
        lines = response.iter_lines()
        got = 0
        for line in lines:
            got += line.startswith("data: ")
            if got >= 5:
                break
    # the connection is closed here; the reply asked for 100,000 tokens
    record = lambda: next(r for r in tiny_server.activity.records() if r.id not in before)  # noqa: E731
    wait_for(lambda: record().state is RequestState.STOPPED, 120, "the generation stopped")
    assert record().completion_tokens < 2000  # stopped a few tokens after the disconnect (counted in tokens, not seconds)
    reply = tiny_server.openai().chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
    assert reply.choices[0].message.content is not None


def test_full_queue_is_429_with_retry_after(tiny_dense_path):
    with serve(tiny_dense_path, queue_limit=1, parallel=1) as served:  # one in the batch, one waiting
        body = endless(served, stream=True)
        streams = []
        first_data = threading.Event()

        def hold() -> None:
            with httpx2.stream("POST", f"{served.url}/v1/chat/completions", json=body, timeout=60) as response:
                streams.append(response)
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        first_data.set()
                    if len(streams) > 1:
                        return

        runner = threading.Thread(target=hold)
        runner.start()
        assert first_data.wait(30)
        waiting = threading.Thread(target=lambda: httpx2.post(f"{served.url}/v1/chat/completions", json=endless(served, max_tokens=4), timeout=60))
        waiting.start()
        wait_for(lambda: len(served.activity.records()) == 2, 60, "the second request queued")
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0) as client:
            try:
                client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            except openai.RateLimitError as exc:
                assert int(exc.response.headers["retry-after"]) >= 1
                assert exc.body["type"] == "rate_limit_error"
            else:
                raise AssertionError("a third request beyond the queue limit was not refused")
        streams.append(None)  # let the holder hang up: its generation stops, the queued one runs
        runner.join(30)
        waiting.join(60)
        assert not waiting.is_alive()


def test_a_client_that_gives_up_on_a_plain_reply_stops_it_too(tiny_server):
    before = {r.id for r in tiny_server.activity.records()}
    body = endless(tiny_server)
    try:
        httpx2.post(f"{tiny_server.url}/v1/chat/completions", json=body, timeout=0.5)
    except httpx2.TimeoutException:
        pass
    else:
        raise AssertionError("an endless reply came back within 0.5 s")
    record = lambda: next(r for r in tiny_server.activity.records() if r.id not in before)  # noqa: E731
    # Stopped long before its 100,000 tokens (minutes of them): waited on, not timed, as a suite beside slows it.
    wait_for(lambda: record().state is RequestState.STOPPED, 120, "the generation stopped")
    assert record().completion_tokens < 100_000


def test_quiet_streams_get_keepalives(tiny_dense_path):
    """While a request waits (the engine busy elsewhere, or a long prefill), each API keeps the stream alive."""
    import threading as th

    with serve(tiny_dense_path, keepalive_s=0.05, first_event_wait_s=0.05) as served:
        gate, parked = th.Event(), th.Event()
        served.engine.submit("test-gate", lambda _job: (parked.set(), gate.wait(30)))
        assert parked.wait(60)
        try:
            with httpx2.stream(
                "POST", f"{served.url}/v1/chat/completions", timeout=30, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
            ) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line) == ": keepalive"
            with httpx2.stream(
                "POST", f"{served.url}/v1/messages", timeout=30, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
            ) as response:
                events, comments, lines = [], 0, response.iter_lines()
                for line in lines:
                    if line.startswith("event: "):
                        events.append(line[7:])
                    comments += line == ": keepalive"
                    if comments == 2:
                        gate.set()  # the engine takes the request: message_start comes, with its usage
                    if "message_start" in events:
                        break
                # comments while it waits (message_start's usage needs the engine's checkpoint lookup), then the
                # stream opens as the real API's does: message_start first, then ping
                assert comments >= 2 and events == ["message_start"]
                assert next(line for line in lines if line.startswith("event: ")) == "event: ping"
        finally:
            gate.set()


def test_an_sdk_stream_that_waits_in_the_queue_reads_the_keepalives_then_the_reply(tiny_dense_path):
    """Keep-alive comments come before message_start while the engine is busy elsewhere; the SDK's stream takes them."""
    with serve(tiny_dense_path, keepalive_s=0.05, first_event_wait_s=0.05) as served:
        gate, parked = threading.Event(), threading.Event()
        served.engine.submit("test-gate", lambda _job: (parked.set(), gate.wait(30)))
        assert parked.wait(60)
        finals = []

        def ask() -> None:
            with served.anthropic().messages.stream(
                model="m", max_tokens=64, extra_body={"temperature": 0.0}, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                finals.append(stream.get_final_message())

        client = threading.Thread(target=ask)
        client.start()
        wait_for(lambda: len(served.activity.records()) == 1, 60, "the request queued")
        time.sleep(0.3)  # several keep-alives go out meanwhile
        gate.set()
        client.join(60)
        (final,) = finals
        assert final.content[0].text == ANSWER and final.stop_reason == "end_turn" and final.usage.input_tokens > 0
