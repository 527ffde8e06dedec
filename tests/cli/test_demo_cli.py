"""`qwen-desk demo`: a tiny model made on this machine, chatted with through the real engine, saying what it is (#34)."""

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


def test_an_earlier_versions_demo_model_is_made_again():
    dest = demo.ensure_demo_model()
    (dest / demo.COMPLETE_MARK).write_text("made by Qwen Desk: random weights, writes nonsense\n")  # before #34
    assert demo.ensure_demo_model() == dest
    assert (dest / demo.COMPLETE_MARK).read_text() == demo.MARK_TEXT


def test_the_demo_says_what_it_is_and_what_a_real_model_will_do(capsys):
    """Through the real chat path, under the model card's sampling (no greedy, no seed): every turn, whatever it asks,
    gets the demo's own words: thinking where a real model's reasoning goes, then what the demo is and what to do."""
    prompts = ["What is the capital of France?", "Write me a poem about the sea", "Why?"]
    assert main(["demo", *(a for p in prompts for a in ("--prompt", p)), "--json", "--no-history"]) == 0
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(t["reasoning"], t["text"], t["finish_reason"]) for t in turns] == [("".join(demo.REASONING), demo.REPLY, "stop")] * 3
    assert demo.REPLY.startswith("I am the demo model: a tiny model with random weights")
    assert "I cannot read your message" in demo.REPLY and "Download a real Qwen3.5 model" in demo.REPLY
    assert "A real model thinks here" in "".join(demo.REASONING)


def test_demo_takes_chats_flags_and_says_what_it_is(capsys):
    assert main(["demo", "--prompt", "hi", "--no-think", "--no-history"]) == 0
    out, err = capsys.readouterr()
    assert "cannot read what you write" in err and "download a Qwen3.5 model" in err  # the notice, before the chat
    assert out.strip().endswith(demo.REPLY.strip())  # no thinking asked: the answer alone
    assert main(["demo", "--prompt", "hi", "--json", "--no-history"]) == 0
    (turn,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert turn["generation_tokens"] <= 200  # the demo keeps replies short
