"""One rule for --context everywhere: fit, chat and serve refuse a context above the model's maximum the same way."""

from __future__ import annotations

import json

import pytest

from macapp.cli import main
from macapp.core import context_limit

HUGE = "99999999999"


def _maximum(folder) -> int:
    return context_limit.longest_context(json.loads((folder / "config.json").read_text()))


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_chat_and_serve_refuse_a_context_above_the_models_maximum_before_loading(command, capsys, tiny_dense_path):
    code = main([command, "--model", str(tiny_dense_path), "--context", HUGE, *(["--prompt", "hi"] if command == "chat" else [])])
    _out, err = capsys.readouterr()
    assert code == 2
    assert f"context 99,999,999,999 is above {tiny_dense_path.name}'s maximum of {_maximum(tiny_dense_path):,} tokens" in err
    assert "loaded in" not in err  # refused before the model was read


def test_fit_says_the_same_sentence(capsys, tiny_dense_path):
    assert main(["fit", str(tiny_dense_path), "--context", HUGE]) == 2
    assert f"context 99,999,999,999 is above {tiny_dense_path.name}'s maximum of {_maximum(tiny_dense_path):,} tokens" in capsys.readouterr().err


def test_the_maximum_is_one_function_of_the_config_that_the_catalog_uses_too():
    # past the native length with YaRN ×4, capped in the card's proportion (1,010,000 of 4 × 262,144)
    assert context_limit.longest_context({"max_position_embeddings": 4096}) == 15_781
    assert context_limit.longest_context({"text_config": {"max_position_embeddings": 8192}}) == 31_562
    assert context_limit.longest_context({}) == 1_010_000
    assert context_limit.native_context({}) == context_limit.NATIVE_DEFAULT
    linear = {"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}
    assert context_limit.longest_context(linear) == 4096  # no YaRN for a rope it cannot extend
    for bad in (0, -1, "long", True, 1.5):
        with pytest.raises(context_limit.ContextError):
            context_limit.longest_context({"max_position_embeddings": bad})
    with pytest.raises(context_limit.ContextError, match="at least 1 token"):
        context_limit.check_context(0, 4096, "m")
    context_limit.check_context(4096, 4096, "m")  # the maximum itself is allowed


def test_a_context_inside_the_maximum_still_reaches_chat(capsys, tiny_dense_path):
    code = main(["chat", "--model", str(tiny_dense_path), "--context", "1k", "--prompt", "hi", "--temp", "0", "--no-history", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["text"]
