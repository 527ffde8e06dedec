"""`--mtp on|off|auto` on `qwen-desk chat` and `qwen-desk serve`, and the MTP figures of chat's --json records."""

from __future__ import annotations

import json

import pytest

from macapp.cli import main
from macapp.core.demo.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def with_head(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("mtp-cli") / "tiny-with-head", "moe", mtp="successor")


def chat(capsys, *argv):
    code = main(["chat", *argv, "--json", "--no-history", "--temp", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()], err


def test_mtp_on_gives_the_same_turns_with_its_figures_in_json(capsys, with_head):
    prompts = ["--prompt", "hello there", "--prompt", "and again"]
    off, _ = chat(capsys, "--model", str(with_head), *prompts, "--mtp", "off")
    on, err = chat(capsys, "--model", str(with_head), *prompts, "--mtp", "on")
    assert "--mtp" not in err
    for a, b in zip(off, on, strict=True):
        assert (b["text"], b["reasoning"], b["generation_tokens"], b["context_tokens"]) == (
            a["text"],
            a["reasoning"],
            a["generation_tokens"],
            a["context_tokens"],
        )
        assert a["mtp_steps"] == 0 and a["mtp_acceptance"] == 0 and a["mtp_tokens_per_step"] == 0
        # on the script nearly every draft is right (a turn's context can send the model off the head's script)
        assert b["mtp_steps"] > 0 and b["mtp_acceptance"] > 0.8 and b["mtp_tokens_per_step"] > 1
    (auto,), _ = chat(capsys, "--model", str(with_head), "--prompt", "hello there")  # auto is the default
    assert auto["text"] == off[0]["text"]


def test_mtp_on_without_a_head_says_where_it_comes_from_and_answers(capsys, tiny_moe_path):
    (turn,), err = chat(capsys, "--model", str(tiny_moe_path), "--prompt", "hi", "--mtp", "on")
    assert "--mtp on" in err and "no usable MTP head" in err and f"qwen-desk download {tiny_moe_path.name} --mtp" in err
    assert turn["text"] and turn["mtp_steps"] == 0
    (quiet,), err = chat(capsys, "--model", str(tiny_moe_path), "--prompt", "hi")  # auto: nothing to say
    assert "MTP" not in err and quiet["text"] == turn["text"]


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_a_bad_mtp_value_is_refused_before_loading(capsys, tiny_moe_path, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--model", str(tiny_moe_path), "--mtp", "sometimes", "--prompt", "hi"][: 5 if command == "serve" else 7])
    assert exit_.value.code == 2 and "--mtp" in capsys.readouterr().err


def test_serve_passes_mtp_to_the_one_at_a_time_path(tiny_moe_path):
    from macapp.core.engine import Engine
    from macapp.core.engine.options import MTPMode
    from macapp.server.engine_backend import serving_backend

    engine = Engine()
    try:
        assert serving_backend(engine, mtp=MTPMode.OFF).options.session.mtp is MTPMode.OFF
        assert serving_backend(engine).options.session.mtp is MTPMode.AUTO
    finally:
        engine.close()
