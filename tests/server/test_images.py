"""Pictures over the API, through the real openai and anthropic SDKs against a live server on the tiny vision model:
OpenAI image_url parts with data: URLs and Anthropic base64 image blocks reach the model (more prompt tokens for a
bigger picture, the same reply as the engine's own session); remote URLs and bad pictures get a clear 400."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest

from macapp.core.sampling import greedy
from tests.fixtures.vision import picture_bytes, tiny_vlm_path  # noqa: F401  (fixture)
from tests.server.conftest import GREEDY, serve

OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def vision_server(tiny_vlm_path):
    with serve(tiny_vlm_path, default_thinking=False) as served:
        yield served


def _data_url(size=(96, 64), fmt="PNG", seed=0) -> str:
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(picture_bytes(size, fmt, seed)).decode()


def _openai_message(text, *urls):
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls), {"type": "text", "text": text}]}]


def test_openai_image_url_parts_reach_the_model(vision_server):
    client = vision_server.openai()
    plain = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "what is it?"}], max_tokens=8, extra_body=OFF, **GREEDY)
    small = client.chat.completions.create(model="x", messages=_openai_message("what is it?", _data_url((64, 64))), max_tokens=8, extra_body=OFF, **GREEDY)
    big = client.chat.completions.create(model="x", messages=_openai_message("what is it?", _data_url((192, 128))), max_tokens=8, extra_body=OFF, **GREEDY)
    two = client.chat.completions.create(
        model="x", messages=_openai_message("what is it?", _data_url((64, 64)), _data_url((192, 128))), max_tokens=8, extra_body=OFF, **GREEDY
    )
    # each picture: its image tokens plus its vision start/end marks
    assert small.usage.prompt_tokens == plain.usage.prompt_tokens + 4 + 2
    assert big.usage.prompt_tokens == plain.usage.prompt_tokens + 24 + 2
    assert two.usage.prompt_tokens == plain.usage.prompt_tokens + 28 + 4
    assert small.usage.prompt_tokens_details.cached_tokens == 0


def test_the_api_answers_like_the_engines_own_session(vision_server):
    engine = vision_server.engine
    vocab = engine.model.tokenizer.get_vocab()
    bias = {vocab["<|im_end|>"]: -100.0, vocab["<|endoftext|>"]: -100.0}  # long, context-dependent replies
    for seed in (2, 9):
        reply = vision_server.openai().chat.completions.create(
            model="x",
            messages=_openai_message("describe it", _data_url((128, 96), seed=seed)),
            max_tokens=24,
            logit_bias={str(k): v for k, v in bias.items()},
            presence_penalty=0,
            extra_body=OFF,
            **GREEDY,
        )
        own = (
            engine.new_session()
            .send("describe it", thinking=False, sampling=greedy(24, logit_bias=bias), images=[picture_bytes((128, 96), seed=seed)])
            .result(timeout=60)
        )
        assert own.stats.image_tokens == 12 and reply.usage.prompt_tokens == own.stats.prompt_tokens
        assert reply.choices[0].message.content == own.text


def test_anthropic_base64_image_blocks_reach_the_model(vision_server):
    client = vision_server.anthropic()
    data = base64.b64encode(picture_bytes((192, 128), "JPEG")).decode()
    message = client.messages.create(
        model="x",
        max_tokens=8,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": data}}, {"type": "text", "text": "what is it?"}],
            }
        ],
        extra_body={"thinking": {"type": "disabled"}},
    )
    plain = client.messages.create(
        model="x", max_tokens=8, messages=[{"role": "user", "content": "what is it?"}], extra_body={"thinking": {"type": "disabled"}}
    )
    total = plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    assert message.usage.cache_read_input_tokens == 0  # a picture not sent before (the PNG's pixels differ): read afresh
    assert message.usage.input_tokens == total + 24 + 2


def test_remote_image_urls_are_refused_with_a_clear_400(vision_server):
    with pytest.raises(openai.BadRequestError) as info:
        vision_server.openai().chat.completions.create(model="x", messages=_openai_message("hi", "https://example.com/cat.png"), max_tokens=4)
    assert "does not fetch images" in str(info.value)
    with pytest.raises(anthropic.BadRequestError) as info:
        vision_server.anthropic().messages.create(
            model="x",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}],
        )
    assert "does not fetch images" in str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64," + base64.b64encode(b"not a picture").decode(), "image 1: is not a picture"),
        ("data:image/png;base64," + base64.b64encode(picture_bytes((300, 200))[:3000]).decode(), "image 1: is damaged or cut short"),
    ],
)
def test_bad_pictures_are_a_400_naming_them_and_the_server_goes_on(vision_server, url, words):
    client = vision_server.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=_openai_message("hi", url), max_tokens=4)
    assert words in str(info.value)
    ok = client.chat.completions.create(model="x", messages=_openai_message("hi", _data_url()), max_tokens=4, extra_body=OFF, **GREEDY)
    assert ok.usage.completion_tokens > 0


def test_a_text_only_build_refuses_pictures_with_a_400(tiny_server):
    with pytest.raises(openai.BadRequestError) as info:
        tiny_server.openai().chat.completions.create(model="x", messages=_openai_message("hi", _data_url()), max_tokens=4)
    assert "this build is text-only" in str(info.value)


def test_count_tokens_counts_the_pictures(vision_server):
    import httpx2 as httpx

    data = base64.b64encode(picture_bytes((192, 128))).decode()
    body = {
        "model": "x",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}, {"type": "text", "text": "what is it?"}],
            }
        ],
    }
    counted = httpx.post(f"{vision_server.url}/v1/messages/count_tokens", json=body, timeout=30).json()["input_tokens"]
    message = vision_server.anthropic().messages.create(max_tokens=2, extra_body={"thinking": {"type": "disabled"}}, **body)
    assert counted == message.usage.input_tokens + message.usage.cache_read_input_tokens


SCREENSHOT_TOOL = {"name": "screenshot", "description": "Take a screenshot.", "input_schema": {"type": "object", "properties": {}}}


def _after_a_tool_call(client, result_content):
    """A conversation where the model called a tool and the client sends back its result (Claude Code's Read of a
    picture file, a screenshot tool)."""
    return client.messages.create(
        model="x",
        max_tokens=4,
        tools=[SCREENSHOT_TOOL],
        extra_body={"thinking": {"type": "disabled"}},
        messages=[
            {"role": "user", "content": "take a screenshot"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}]},
        ],
    )


def _image_block(size=(192, 128), seed=5):
    data = base64.b64encode(picture_bytes(size, seed=seed)).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def test_a_picture_in_an_anthropic_tool_result_reaches_the_model(vision_server):
    from macapp.core.engine import pictures as engine_pictures
    from tests.core.engine.helpers import on_worker

    def encoded():
        return on_worker(vision_server.engine, lambda m: engine_pictures.vision_for(m).pictures_encoded)

    client = vision_server.anthropic()
    plain = _after_a_tool_call(client, [{"type": "text", "text": "here it is"}])
    before = encoded()
    shot = _after_a_tool_call(client, [{"type": "text", "text": "here it is"}, _image_block()])
    total = [m.usage.input_tokens + m.usage.cache_read_input_tokens for m in (plain, shot)]
    assert total[1] == total[0] + 24 + 2  # the picture's image tokens and its vision marks, inside the tool response
    assert encoded() == before + 1  # the tower ran on it: the picture was not left out


def test_a_bad_picture_in_a_tool_result_is_a_400_naming_it(vision_server):
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(b"not a picture").decode()}}
    with pytest.raises(anthropic.BadRequestError) as info:
        _after_a_tool_call(vision_server.anthropic(), [bad])
    assert "image 1: is not a picture" in str(info.value)


def test_a_picture_in_a_tool_result_on_a_text_only_build_is_a_400(tiny_server):
    with pytest.raises(anthropic.BadRequestError) as info:
        _after_a_tool_call(tiny_server.anthropic(), [{"type": "text", "text": "here it is"}, _image_block()])
    assert "this build is text-only" in str(info.value)


def test_openai_pictures_in_a_tool_message_reach_the_model_and_elsewhere_are_a_400(vision_server):
    client = vision_server.openai()
    call = {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}

    def ask(tool_content, first="take a screenshot"):
        return client.chat.completions.create(
            model="x",
            max_tokens=4,
            extra_body=OFF,
            **GREEDY,
            messages=[
                {"role": "user", "content": first},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": tool_content},
            ],
        )

    plain = ask([{"type": "text", "text": "here it is"}])
    shot = ask([{"type": "text", "text": "here it is"}, {"type": "image_url", "image_url": {"url": _data_url((192, 128))}}])
    assert shot.usage.prompt_tokens == plain.usage.prompt_tokens + 24 + 2
    for role in ("system", "assistant"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="x",
                max_tokens=4,
                messages=[{"role": role, "content": [{"type": "image_url", "image_url": {"url": _data_url()}}]}, {"role": "user", "content": "hi"}],
            )
        assert f"not in a {role} message" in str(info.value)


def test_too_many_pictures_for_the_context_is_a_400_naming_them_and_the_server_goes_on(tiny_vlm_path):
    with serve(tiny_vlm_path, context=120, default_thinking=False) as small:
        client = small.openai()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="x", messages=_openai_message("all of these", *[_data_url((256, 256), seed=s) for s in range(3)]), max_tokens=4
            )
        assert "with its 3 pictures' image tokens" in str(info.value) and "send fewer or smaller pictures" in str(info.value)
        ok = client.chat.completions.create(model="x", messages=_openai_message("just one", _data_url((64, 64))), max_tokens=4, extra_body=OFF, **GREEDY)
        assert ok.usage.completion_tokens > 0
