"""Videos through the real pieces: OpenCV clips made here, mlx-vlm's own video path as the reference, the tiny
Qwen3.5 with a vision tower through the real engine: the same frames, pixels, timestamps, prompt tokens and
greedy reply as mlx-vlm's own generate; more video gives more tokens and max_frames bounds them; every bad input
is refused by name before anything changes; a long 4K-sized clip is decoded at the processor's size."""

from __future__ import annotations

import numpy as np
import pytest

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError
from macapp.core.sampling import greedy
from macapp.core.vision import mlx_frames
from macapp.core.vision.video import VideoError, VideoSettings, frames_that_fit, open_video, plan, probe
from tests.core.engine.helpers import TIMEOUT
from tests.fixtures.video import bad_videos, video  # noqa: F401  (fixtures)

THINK = False
SETTINGS = [VideoSettings(), VideoSettings(fps=1.0), VideoSettings(max_frames=4), VideoSettings(fps=4.0, max_frames=8), VideoSettings(fps=30.0)]


def _mlx_vlm_video(processor, path, settings):
    """mlx-vlm's own path: load_video (full-size frames) then the video processor; (metadata, its outputs)."""
    from mlx_vlm.utils import load_video, resolve_video_sampling

    overrides = {k: v for k, v in (("fps", settings.fps), ("max_frames", settings.max_frames)) if v is not None}
    frames, metadata = load_video(str(path), resolve_video_sampling(processor, overrides))
    return metadata, processor.video_processor(videos=[frames], video_metadata=[metadata])


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_frames_pixels_and_timestamps_are_mlx_vlms(tiny_vlm_path, video, settings):
    from mlx_vlm import load

    _model, processor = load(str(tiny_vlm_path))
    path = video("walk.mp4", size=(320, 240), frames=37, fps=12.0)
    clip = open_video(path, mlx_frames.video_processor(tiny_vlm_path), settings)
    metadata, theirs = _mlx_vlm_video(processor, path, settings)
    assert list(clip.plan.indices) == metadata.frames_indices
    ours = processor.video_processor(videos=[clip.pixels], video_metadata=[clip.metadata])
    assert np.array_equal(ours["video_grid_thw"], theirs["video_grid_thw"])
    assert np.array_equal(ours["pixel_values_videos"], theirs["pixel_values_videos"])
    expected = processor(text=["<|vision_start|><|video_pad|><|vision_end|>"], videos=[clip.pixels], video_metadata=[metadata])
    assert processor.tokenizer.decode(expected["input_ids"][0].tolist()) == clip.plan.placeholder_text()


def test_a_video_reaches_the_model_like_mlx_vlms_own_generate(engine, tiny_vlm_path, video, long_reply):
    from mlx_vlm import load, stream_generate

    path = video("scene.mp4", size=(96, 64), frames=24, fps=8.0)
    settings = VideoSettings(fps=2.0, max_frames=6)
    clip = open_video(path, mlx_frames.video_processor(tiny_vlm_path), settings)
    question = "What happens in this video?"
    reply = engine.new_session().send(question, thinking=THINK, sampling=long_reply, images=[clip]).result(timeout=TIMEOUT)
    text = engine.model.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}],
        add_generation_prompt=True,
        enable_thinking=THINK,
        tokenize=False,
    )
    model, processor = load(str(tiny_vlm_path))
    n = len(reply.token_ids)
    assert n >= 20
    results = list(
        stream_generate(model, processor, text, video=[str(path)], fps=2.0, max_frames=6, max_tokens=n, temperature=0, logit_bias=long_reply.logit_bias)
    )
    assert reply.token_ids == [r.token for r in results][:n]
    assert reply.stats.prompt_tokens == results[0].prompt_tokens
    assert reply.stats.image_tokens == clip.plan.video_tokens == 3 * 6  # 3 pairs of 96x64 frames: 6 tokens each


def test_more_video_more_tokens_and_max_frames_bounds_them(engine, tiny_vlm_path, video):
    processor = mlx_frames.video_processor(tiny_vlm_path)
    short = open_video(video("short.mp4", frames=20, fps=10.0), processor)  # 2 s at 2 fps: 4 frames
    long = open_video(video("long.mp4", frames=60, fps=10.0), processor)  # 6 s: 12 frames
    bounded = open_video(video("long.mp4", frames=60, fps=10.0), processor, VideoSettings(max_frames=6))
    assert (short.plan.frames, long.plan.frames, bounded.plan.frames) == (4, 12, 6)
    replies = [engine.new_session().send("what?", thinking=THINK, sampling=greedy(2), images=[c]).result(timeout=TIMEOUT) for c in (short, long, bounded)]
    tokens = [r.stats.prompt_tokens for r in replies]
    assert tokens[0] < tokens[2] < tokens[1]
    assert [r.stats.image_tokens for r in replies] == [2 * 4, 6 * 4, 3 * 4]  # 64x64 frames: 4 tokens a pair


@pytest.mark.parametrize("kind", ["missing", "folder", "text as mp4", "cut short", "unsupported codec", "absurd dimensions", "zero frames", "corrupt"])
def test_every_bad_video_is_refused_by_name(tiny_vlm_path, bad_videos, kind):
    path, words = bad_videos[kind]
    with pytest.raises(VideoError) as info:
        open_video(path, mlx_frames.video_processor(tiny_vlm_path))
    assert str(path) in str(info.value) and words in str(info.value)


def test_bad_bytes_are_refused_by_their_label(tiny_vlm_path, bad_videos):
    for data in (b"", bad_videos["text as mp4"][0].read_bytes()):
        with pytest.raises(VideoError) as info:
            open_video(data, mlx_frames.video_processor(tiny_vlm_path), name="video 1")
        assert str(info.value).startswith("video 1: ")


def test_a_video_that_cannot_fit_is_refused_before_decoding_with_the_frames_that_would(tiny_vlm_path, video, monkeypatch):
    processor = mlx_frames.video_processor(tiny_vlm_path)
    path = video("long.mp4", frames=80, fps=10.0)  # 8 s: 16 frames, 4 video tokens + 8 marks a pair = 96 tokens
    decoded = []
    monkeypatch.setattr(mlx_frames, "resize_frame", lambda *a: decoded.append(a) or np.zeros((3, 64, 64), np.uint8))
    with pytest.raises(VideoError) as info:
        open_video(path, processor, room=40)
    assert decoded == []
    assert "at most 6 frames fit: use --video-max-frames 6" in str(info.value) and "16 frames" in str(info.value)
    assert frames_that_fit(plan(probe(path), processor), processor, 40) == 6
    monkeypatch.undo()
    assert open_video(path, processor, VideoSettings(max_frames=6), room=40).plan.prompt_cost <= 40


def test_a_text_only_build_refuses_a_video(tiny_dense_path, tiny_vlm_path, video):
    clip = open_video(video(), mlx_frames.video_processor(tiny_vlm_path))
    e = Engine()
    e.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
    try:
        s = e.new_session()
        with pytest.raises(EngineError) as info:
            s.send("watch", thinking=THINK, images=[clip]).result(timeout=TIMEOUT)
        assert info.value.code == ev.TEXT_ONLY and "text-only" in str(info.value) and s.messages == []
    finally:
        e.close()


def test_a_big_clip_is_kept_at_the_processors_size_only(tiny_vlm_path, video):
    clip = open_video(video("big.mp4", size=(1920, 1080), frames=12, fps=4.0), mlx_frames.video_processor(tiny_vlm_path))
    assert clip.original_size == (1920, 1080)
    assert clip.pixels.shape[0] == clip.plan.frames and clip.pixels.shape[2:] == clip.plan.size[::-1]
    assert clip.pixels.nbytes <= clip.plan.frames * 3 * 65536  # the tiny processor's pixel budget, not 1080p frames


def test_a_video_turn_matches_mlx_vlms_own_forward_pass_and_its_frames_matter(tiny_vlm_path, video):
    import mlx.core as mx
    import mlx_lm
    from mlx_vlm.utils import prepare_inputs

    from macapp.core.engine.pictures import content_of
    from macapp.core.vision.runner import attach_vision

    text_model, tokenizer = mlx_lm.load(str(tiny_vlm_path))
    vision = attach_vision(text_model, tiny_vlm_path)
    processor = mlx_frames.video_processor(tiny_vlm_path)

    def logits(clip):
        content = content_of({"role": "user", "content": "What moves?", "images": (clip,)})
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, enable_thinking=False)
        turn = vision.encode(prompt, [clip])
        cache = vision.lm.make_cache()
        vision.lm.bind([])
        vision.lm.queue(turn, cache)
        return turn, vision.lm(mx.array([turn.tokens]), cache=cache, input_embeddings=turn.embeddings[None])[0, -1]

    path = video("a.mp4", size=(128, 96), frames=30, fps=10.0)
    turn, ours = logits(open_video(path, processor))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What moves?"}]}],
        add_generation_prompt=True,
        enable_thinking=False,
        tokenize=False,
    )
    inputs = prepare_inputs(vision.processor, videos=[str(path)], prompts=text)
    assert turn.tokens == inputs["input_ids"][0].tolist()
    reference = vision.model(inputs["input_ids"], inputs["pixel_values_videos"], video_grid_thw=inputs["video_grid_thw"]).logits[0, -1]
    assert mx.abs(ours - reference).max().item() < 1e-4
    _, theirs = logits(open_video(video("b.mp4", size=(128, 96), frames=30, fps=10.0, seed=9), processor))
    assert mx.abs(theirs - ours).max().item() > 1e-3


def test_a_two_hour_video_is_sampled_within_the_frame_limit(tiny_vlm_path, video):
    path = video("two-hours.mp4", size=(32, 32), frames=7200, fps=1.0)
    seen = []
    clip = open_video(path, mlx_frames.video_processor(tiny_vlm_path), progress=lambda done, total: seen.append((done, total)))
    assert clip.plan.info.duration_s == 7200 and clip.plan.frames == 16  # the tiny model's max_frames
    assert clip.plan.indices[0] == 0 and clip.plan.indices[-1] == 7199 and clip.pixels.shape[0] == 16
    assert seen == [(n, 16) for n in range(1, 17)]
    assert clip.plan.group_seconds[0] < 300 and clip.plan.group_seconds[-1] > 6900  # the timestamps span the clip


def test_a_video_too_long_for_a_sessions_context_says_how_many_frames_fit(engine, tiny_vlm_path, video):
    from macapp.core.engine import SessionOptions

    clip = open_video(video("long.mp4", frames=80, fps=10.0), mlx_frames.video_processor(tiny_vlm_path))  # 16 frames, 32 tokens
    s = engine.new_session(options=SessionOptions(context_limit=80))
    with pytest.raises(EngineError) as info:
        s.send("what moves?", thinking=THINK, images=[clip]).result(timeout=TIMEOUT)
    assert info.value.code == ev.CONTEXT_LIMIT and "long.mp4: the video does not fit the context" in str(info.value)
    assert "At most" in str(info.value) and s.messages == []


def test_pictures_and_a_video_in_one_message_are_refused_clearly_and_in_turns_they_work(engine, tiny_vlm_path, video):
    from macapp.core.vision.images import image_from_bytes
    from tests.fixtures.vision import picture_bytes

    clip = open_video(video(), mlx_frames.video_processor(tiny_vlm_path))
    picture = image_from_bytes(picture_bytes((64, 64)), "p.png")
    s = engine.new_session()
    with pytest.raises(EngineError) as info:
        s.send("both?", thinking=THINK, sampling=greedy(2), images=[picture, clip]).result(timeout=TIMEOUT)
    assert info.value.code == ev.BAD_IMAGE and "in a message of its own" in str(info.value) and s.messages == []
    first = s.send("a picture", thinking=THINK, sampling=greedy(2), images=[picture]).result(timeout=TIMEOUT)
    then = s.send("then a video", thinking=THINK, sampling=greedy(2), images=[clip]).result(timeout=TIMEOUT)
    assert (first.stats.image_tokens, then.stats.image_tokens) == (4, clip.plan.video_tokens)
