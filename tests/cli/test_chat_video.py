"""`qwen-desk chat --video PATH [--video-fps F] [--video-max-frames N]`: the video goes with the first --prompt turn,
the JSON line carries its prompt tokens and the frames used, the flags bound the frames, and bad videos, bad flags
and text-only builds are refused by name (exit 2)."""

from __future__ import annotations

import json

from macapp.cli import main
from tests.fixtures.video import bad_videos, video  # noqa: F401  (fixtures)
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixtures)


def _json_turns(capsys, *argv):
    code = main(["chat", *argv, "--json", "--no-history", "--temp", "0", "--presence-penalty", "0", "--no-think", "--max-tokens", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_a_video_goes_with_the_first_prompt_and_the_flags_bound_its_frames(capsys, tiny_vlm_path, video):
    clip = video("walk.mp4", frames=60, fps=10.0)  # 6 s: 12 frames at the model's 2 fps
    model = ["--model", str(tiny_vlm_path)]
    turns = _json_turns(capsys, *model, "--video", str(clip), "--prompt", "what moves?", "--prompt", "and then?")
    assert [t["video_frames"] for t in turns] == [12, 0] and [t["image_tokens"] for t in turns] == [24, 0]
    (fewer,) = _json_turns(capsys, *model, "--video", str(clip), "--video-max-frames", "4", "--prompt", "what moves?")
    (slower,) = _json_turns(capsys, *model, "--video", str(clip), "--video-fps", "1", "--prompt", "what moves?")
    (plain,) = _json_turns(capsys, *model, "--prompt", "what moves?")
    assert (fewer["video_frames"], slower["video_frames"]) == (4, 6)
    assert plain["prompt_tokens"] < fewer["prompt_tokens"] < slower["prompt_tokens"] < turns[0]["prompt_tokens"]


def test_bad_videos_and_flags_exit_2_naming_them(capsys, tiny_vlm_path, bad_videos, video):
    for kind in ("missing", "text as mp4", "unsupported codec", "zero frames"):
        path, words = bad_videos[kind]
        code = main(["chat", "--model", str(tiny_vlm_path), "--video", str(path), "--prompt", "hi", "--no-history"])
        out, err = capsys.readouterr()
        assert code == 2 and str(path) in err and words in err and "Traceback" not in err and out == "", (kind, err)
    for flags, words in [(["--video-fps", "0"], "--video-fps must be more than 0"), (["--video-max-frames", "1"], "--video-max-frames must be at least 2")]:
        code = main(["chat", "--model", str(tiny_vlm_path), "--video", str(video()), *flags, "--prompt", "hi", "--no-history"])
        assert code == 2 and words in capsys.readouterr().err
    code = main(["chat", "--model", str(tiny_vlm_path), "--video-fps", "1", "--prompt", "hi", "--no-history"])
    assert code == 2 and "need --video PATH" in capsys.readouterr().err


def test_a_video_too_long_for_the_context_is_refused_with_the_frames_that_fit(capsys, tiny_vlm_path, video):
    code = main(["chat", "--model", str(tiny_vlm_path), "--video", str(video(frames=80)), "--context", "40", "--prompt", "hi", "--no-history"])
    err = capsys.readouterr().err
    assert code == 2 and "at most 6 frames fit: use --video-max-frames 6" in err


def test_a_text_only_build_says_so(capsys, tiny_dense_path, video):
    code = main(["chat", "--model", str(tiny_dense_path), "--video", str(video()), "--prompt", "hi", "--no-history", "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and "this build is text-only: use" in err and "--video" in err


def test_a_video_is_saved_by_its_digest_and_a_resumed_conversation_reads_the_same_frames(capsys, tiny_vlm_path, video):
    from macapp.core import paths
    from macapp.core.history import Store
    from macapp.core.vision.pictures import FILES

    args = ["--model", str(tiny_vlm_path), "--json", "--temp", "0", "--no-think", "--max-tokens", "3"]
    clip = video("walk.mp4", frames=60, fps=10.0)
    assert main(["chat", *args, "--video", str(clip), "--video-max-frames", "6", "--prompt", "what moves?"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    stored = list(paths.pictures_dir().glob("*.video.npz"))
    assert len(stored) == 1 and first["video_frames"] == 6
    with Store.open(pictures=FILES) as store:
        (message,) = [m for m in store.get_conversation(first["conversation_id"]).chat_messages() if m["role"] == "user"]
    (reopened,) = message["images"]
    assert reopened.plan.frames == 6 and reopened.pixels.shape[0] == 6 and stored[0].name.startswith(reopened.digest.removeprefix("video:"))
    # resumed: the conversation is read once with its video (the same frames and tokens), then appended
    assert main(["chat", *args, "--resume", str(first["conversation_id"]), "--prompt", "and then?"]) == 0
    resumed = json.loads(capsys.readouterr().out.splitlines()[0])
    assert resumed["image_tokens"] == first["image_tokens"] == 3 * 4 and resumed["prompt_tokens"] > first["prompt_tokens"]
