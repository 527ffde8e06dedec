"""Videos over the API, through the real openai SDK against a live server on the tiny vision model: `video_url` parts
with data: URLs reach the model (the same prompt tokens and reply as the engine's own session), `video_fps` and
`video_max_frames` sample them, a repeated request reuses the video's tokens (keyed by its content and sampling),
and remote URLs and bad videos get a 400 in OpenAI's error shape with the server answering afterwards."""

from __future__ import annotations

import base64

import openai
import pytest

from macapp.core.sampling import greedy
from macapp.core.vision import mlx_frames
from macapp.core.vision.video import VideoSettings, open_video
from tests.fixtures.video import bad_videos, write_video  # noqa: F401  (fixture)
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixture)
from tests.server.conftest import GREEDY, serve

OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def vision_server(tiny_vlm_path):
    with serve(tiny_vlm_path, default_thinking=False) as served:
        yield served


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("clips") / "walk.mp4", frames=60, fps=10.0)


def _data_url(path) -> str:
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def _message(text, url):
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": text}]}]


def test_a_video_url_part_answers_like_the_engines_own_session_and_sampling_is_per_request(vision_server, tiny_vlm_path, clip):
    engine = vision_server.engine
    vocab = engine.model.tokenizer.get_vocab()
    bias = {vocab["<|im_end|>"]: -100.0, vocab["<|endoftext|>"]: -100.0}
    client = vision_server.openai()
    reply = client.chat.completions.create(
        model="x",
        messages=_message("what moves?", _data_url(clip)),
        max_tokens=16,
        logit_bias={str(k): v for k, v in bias.items()},
        presence_penalty=0,
        extra_body={**OFF, "video_max_frames": 4},
        **GREEDY,
    )
    video = open_video(clip, mlx_frames.video_processor(tiny_vlm_path), VideoSettings(max_frames=4))
    own = engine.new_session().send("what moves?", thinking=False, sampling=greedy(16, logit_bias=bias), images=[video]).result(timeout=60)
    assert own.stats.image_tokens == 2 * 4 and reply.usage.prompt_tokens == own.stats.prompt_tokens
    assert reply.choices[0].message.content == own.text
    more = client.chat.completions.create(model="x", messages=_message("what moves?", _data_url(clip)), max_tokens=2, extra_body=OFF, **GREEDY)
    fewer = client.chat.completions.create(
        model="x", messages=_message("what moves?", _data_url(clip)), max_tokens=2, extra_body={**OFF, "video_fps": 1}, **GREEDY
    )
    assert fewer.usage.prompt_tokens < more.usage.prompt_tokens and reply.usage.prompt_tokens < fewer.usage.prompt_tokens


def test_a_repeated_request_reuses_the_videos_tokens(vision_server, clip):
    client = vision_server.openai()
    messages = _message("count the frames", _data_url(clip))
    first = client.chat.completions.create(model="x", messages=messages, max_tokens=4, extra_body={**OFF, "video_max_frames": 8}, **GREEDY)
    follow = messages + [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "and again?"}]
    again = client.chat.completions.create(model="x", messages=follow, max_tokens=4, extra_body={**OFF, "video_max_frames": 8}, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens > 4 * 4  # past the video's tokens
    other = client.chat.completions.create(model="x", messages=follow, max_tokens=4, extra_body={**OFF, "video_max_frames": 4}, **GREEDY)
    assert other.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens  # other sampling: not reused


def test_remote_and_bad_videos_get_a_400_in_openais_shape_and_the_server_answers_after(vision_server, bad_videos):
    client = vision_server.openai()
    cases = [
        ("https://example.com/clip.mp4", "remote video URLs are not fetched"),
        ("data:video/mp4;base64,@@@not base64@@@", "not valid base64"),
        ("data:image/png;base64,AAAA", "of a video type"),
        (_data_url(bad_videos["text as mp4"][0]), "video 1: is not a video"),
        (_data_url(bad_videos["zero frames"][0]), "video 1: has no video frames"),
    ]
    for url, words in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="x", messages=_message("look", url), max_tokens=2, extra_body=OFF, **GREEDY)
        assert info.value.status_code == 400 and words in info.value.body["message"], (url[:40], info.value.body)
        assert info.value.body["type"] == "invalid_request_error"
    ok = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "still there?"}], max_tokens=2, extra_body=OFF, **GREEDY)
    assert ok.choices[0].message.content is not None


def test_the_responses_api_has_no_video_input_and_says_where_to_send_one(vision_server, clip):
    client = vision_server.openai()
    for kind in ("input_video", "video_url"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="x", input=[{"role": "user", "content": [{"type": kind, "video_url": _data_url(clip)}]}], max_output_tokens=2)
        assert info.value.status_code == 400 and "send the video to /v1/chat/completions as a video_url part" in info.value.body["message"]
