"""`qwen-desk chat --image`: pictures go with the first --prompt turn, /image with the next message; the JSON line
carries image_tokens; bad pictures and text-only builds are refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from macapp.cli import main
from tests.fixtures.vision import picture, tiny_vlm_path  # noqa: F401  (fixtures)


def _json_turns(capsys, *argv):
    code = main(["chat", *argv, "--json", "--no-history", "--temp", "0", "--no-think"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_images_go_with_the_first_prompt_and_the_json_line_counts_them(capsys, tiny_vlm_path, picture):
    a, b = picture("a.png", (64, 64)), picture("b.png", (192, 128))
    turns = _json_turns(capsys, "--model", str(tiny_vlm_path), "--image", str(a), "--image", str(b), "--prompt", "compare these", "--prompt", "and now?")
    assert [t["image_tokens"] for t in turns] == [28, 0]  # 4 + 24, then nothing re-encoded
    assert turns[0]["prompt_tokens"] > 28 and turns[1]["prompt_tokens"] < turns[0]["prompt_tokens"] - 28
    (plain,) = _json_turns(capsys, "--model", str(tiny_vlm_path), "--prompt", "compare these")
    assert plain["image_tokens"] == 0 and plain["prompt_tokens"] == turns[0]["prompt_tokens"] - 28 - 2 * 2  # and their start/end marks


def test_a_bad_picture_exits_2_naming_it_before_loading(capsys, tiny_vlm_path, tmp_path):
    (tmp_path / "text.png").write_text("words")
    for bad, words in [(tmp_path / "nope.jpg", "no such file"), (tmp_path / "text.png", "is not a picture")]:
        code = main(["chat", "--model", str(tiny_vlm_path), "--image", str(bad), "--prompt", "hi", "--no-history"])
        out, err = capsys.readouterr()
        assert code == 2 and bad.name in err and words in err and out == ""


def test_a_text_only_build_says_so(capsys, tiny_dense_path, picture):
    code = main(["chat", "--model", str(tiny_dense_path), "--image", str(picture()), "--prompt", "hi", "--no-history", "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and "this build is text-only: use" in err


def test_interactive_image_command_attaches_to_the_next_message(tiny_vlm_path, picture, tmp_path):
    pic = picture("shot.png", (128, 64))
    script = f"/image {tmp_path / 'missing.png'}\n/image {pic}\nwhat is this?\nand this?\n/quit\n"
    env = dict(os.environ, QWEN_DESK_HOME=str(tmp_path / "home"), MLX_DISABLE_COMPILE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "macapp", "chat", "--model", str(tiny_vlm_path), "--temp", "0", "--no-think", "--no-history"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "missing.png: no such file" in proc.stderr
    assert "shot.png (128x64) goes with your next message" in proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("prompt ")]
    assert len(stats) == 2
    first, second = (int(line.split()[1]) for line in stats)
    assert first > second + 8 - 1  # the picture's 8 image tokens were read with the first message only


def test_pictures_are_saved_with_the_conversation_and_resume_with_it(capsys, tiny_vlm_path, picture):
    from macapp.core import paths
    from macapp.core.history import Store

    pic = picture("receipt.png", (96, 96))
    code = main(["chat", "--model", str(tiny_vlm_path), "--image", str(pic), "--prompt", "total?", "--json", "--temp", "0", "--no-think"])
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0 and first["image_tokens"] == 9
    with Store.open() as store:
        conv = store.get_conversation(first["conversation_id"])
    (ref,) = conv.messages[0].images
    assert conv.messages[1].stats.image_tokens == 9 and "9 image" in conv.messages[1].stats.summary()
    assert ref.name == "receipt.png" and (ref.width, ref.height) == (96, 96)
    assert (paths.pictures_dir() / ref.file_name).is_file()
    # resumed: the conversation is read once with its picture (image tokens again), then appended
    code = main(
        ["chat", "--model", str(tiny_vlm_path), "--resume", str(first["conversation_id"]), "--prompt", "and the tax?", "--json", "--temp", "0", "--no-think"]
    )
    resumed = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0 and resumed["image_tokens"] == 9 and resumed["prompt_tokens"] > first["prompt_tokens"]


def test_a_text_chat_on_a_build_that_sees_never_imports_mlx_vlm(tiny_vlm_path):
    code = (
        "import sys; from macapp.cli import main;"
        "rc = main(['chat', '--model', sys.argv[1], '--prompt', 'hi', '--max-tokens', '3', '--no-history', '--json']);"
        "print('VLM', 'mlx_vlm' in sys.modules); sys.exit(rc)"
    )
    env = dict(os.environ, MLX_DISABLE_COMPILE="1")
    res = subprocess.run([sys.executable, "-c", code, str(tiny_vlm_path)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "VLM False" in res.stdout  # the tower (and mlx-vlm) wait for the first picture
