"""Prompt reuse with pictures over the API, through the real openai and anthropic SDKs against a live server on the
tiny vision model: a follow-up about the same picture reports the conversation, picture included, as cached, the
tower does not run again, and the reply is the one a from-scratch read gives."""

from __future__ import annotations

import base64

import pytest

from macapp.core.engine import pictures as engine_pictures
from tests.core.engine.helpers import on_worker
from tests.fixtures.vision import picture_bytes, tiny_vlm_path  # noqa: F401  (fixture)
from tests.server.conftest import GREEDY, no_eos_bias, serve

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
PICTURE = picture_bytes((128, 96), seed=11)  # 12 image tokens
URL = "data:image/png;base64," + base64.b64encode(PICTURE).decode()


@pytest.fixture(scope="module")
def vision_server(tiny_vlm_path):
    with serve(tiny_vlm_path, default_thinking=False) as served:
        yield served


def _encoded(served) -> int:
    return on_worker(served.engine, lambda m: engine_pictures.vision_for(m).pictures_encoded)


def _generation_prompt(served) -> int:
    """The tokens of the prompt's generation prompt (thinking off): a follow-up reuses all before it."""
    tokenizer = served.engine.model.tokenizer
    turn = [{"role": "user", "content": "x"}]
    with_prompt, without = (tokenizer.apply_chat_template(turn, add_generation_prompt=g, enable_thinking=False, tokenize=True) for g in (True, False))
    return len(with_prompt) - len(without)


def _forget_checkpoints(served) -> None:
    on_worker(served.engine, lambda m: served.backend.pool.clear())


def test_an_openai_follow_up_about_the_same_picture_reads_only_its_tail(vision_server):
    client = vision_server.openai()
    kw = dict(model="x", max_tokens=16, logit_bias=no_eos_bias(vision_server), extra_body=OFF, **GREEDY)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": URL}}, {"type": "text", "text": "describe it"}]}]
    first = client.chat.completions.create(messages=messages, **kw)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "and its colour?"}]
    before = _encoded(vision_server)
    follow_up = client.chat.completions.create(messages=messages, **kw)
    assert _encoded(vision_server) == before  # the picture was not encoded again
    cached = follow_up.usage.prompt_tokens_details.cached_tokens
    assert cached == first.usage.prompt_tokens - _generation_prompt(vision_server) > 12  # the picture's 12 and more
    _forget_checkpoints(vision_server)
    fresh = client.chat.completions.create(messages=messages, **kw)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0 and _encoded(vision_server) == before + 1
    assert follow_up.usage.prompt_tokens == fresh.usage.prompt_tokens
    assert follow_up.choices[0].message.content == fresh.choices[0].message.content


def test_an_anthropic_follow_up_reports_the_picture_as_cache_read(vision_server):
    client = vision_server.anthropic()
    data = base64.b64encode(picture_bytes((96, 64), seed=12)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]
    kw = dict(model="x", max_tokens=8, extra_body={"thinking": {"type": "disabled"}})
    first = client.messages.create(messages=messages, **kw)
    assert first.usage.cache_read_input_tokens == 0
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "and its colour?"}]
    before = _encoded(vision_server)
    follow_up = client.messages.create(messages=messages, **kw)
    assert _encoded(vision_server) == before
    assert follow_up.usage.cache_read_input_tokens == first.usage.input_tokens - _generation_prompt(vision_server) > 6
