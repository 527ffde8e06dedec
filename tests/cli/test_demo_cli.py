"""`qwen-desk demo`: a tiny model made on this machine, chatted with through the real engine, saying what it is."""

from __future__ import annotations

import json

from macapp.cli import main
from macapp.core import paths
from macapp.core.demo import model as demo


def test_demo_makes_the_model_once_and_prints_its_folder(capsys):
    assert main(["demo", "--path"]) == 0
    folder = capsys.readouterr().out.strip()
    assert folder == str(demo.demo_model_dir()) and demo.demo_model_dir().is_relative_to(paths.app_home())
    assert demo.is_demo_model(folder)
    weights = demo.demo_model_dir() / "model.safetensors"
    made = weights.stat().st_mtime_ns
    assert main(["demo", "--path"]) == 0 and capsys.readouterr().out.strip() == folder
    assert weights.stat().st_mtime_ns == made  # reused, not made again


def test_a_half_made_demo_model_is_made_again():
    dest = demo.demo_model_dir()
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{")  # an earlier try cut short: no completion mark
    assert demo.ensure_demo_model() == dest
    assert json.loads((dest / "config.json").read_text())["model_type"] == "qwen3_5_moe"
    assert demo.is_demo_model(dest)
    assert [p.name for p in dest.parent.iterdir() if p.name.startswith(".demo-")] == []  # no staging left behind


def test_demo_chats_with_chats_flags_and_says_it_writes_nonsense(capsys):
    assert main(["demo", "--prompt", "hi", "--no-think", "--no-history"]) == 0
    out, err = capsys.readouterr()
    assert "writes nonsense" in err and "download a Qwen3.5 model" in err
    assert out.strip()  # the reply
    assert main(["demo", "--prompt", "hi", "--json", "--no-history"]) == 0
    (turn,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert turn["generation_tokens"] <= 200  # the demo keeps replies short
