"""The tiny-model fixture: real Qwen3.5 architecture through real mlx-lm, quantized and hub-layout variants."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING, make_tiny_model

THINKING_REPLY = "".join(SCRIPT_REASONING) + "</think>\n\n" + "".join(SCRIPT_ANSWER)
PLAIN_REPLY = "".join(SCRIPT_ANSWER)


def _prompt(tokenizer, thinking, messages=None):
    messages = messages or [{"role": "user", "content": "hello there"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking)


def test_moe_config_has_the_real_layout(tiny_moe_path):
    config = json.loads((tiny_moe_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_moe"
    text = config["text_config"]
    assert text["full_attention_interval"] == 4 and text["num_hidden_layers"] == 4
    assert text["num_experts"] == 8 and text["num_experts_per_tok"] == 2
    assert text["hidden_size"] % 64 == 0 and text["head_dim"] % 64 == 0
    model, _ = mlx_lm.load(str(tiny_moe_path))
    kinds = [type(c) for c in model.make_cache()]
    assert kinds == [ArraysCache, ArraysCache, ArraysCache, KVCache]


def test_the_two_layer_model_has_one_deltanet_and_one_full_attention_layer_and_keeps_the_script(tmp_path):
    path = make_tiny_model(tmp_path / "two", kind="dense", num_layers=2)
    text = json.loads((path / "config.json").read_text())["text_config"]
    assert text["num_hidden_layers"] == 2 and text["full_attention_interval"] == 2
    assert text["layer_types"] == ["linear_attention", "full_attention"]
    model, tokenizer = mlx_lm.load(str(path))
    assert [type(c) for c in model.make_cache()] == [ArraysCache, KVCache]
    assert mlx_lm.generate(model, tokenizer, _prompt(tokenizer, False), max_tokens=40) == PLAIN_REPLY


@pytest.mark.parametrize("fixture", ["tiny_moe_path", "tiny_dense_path", "tiny_moe_4bit_path", "tiny_moe_8bit_path"])
def test_every_variant_follows_the_greedy_script(fixture, request):
    path = request.getfixturevalue(fixture)
    model, tokenizer = mlx_lm.load(str(path))
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    assert mlx_lm.generate(model, tokenizer, _prompt(tokenizer, True), max_tokens=40) == THINKING_REPLY
    assert mlx_lm.generate(model, tokenizer, _prompt(tokenizer, False), max_tokens=40) == PLAIN_REPLY


@pytest.mark.parametrize("fixture,bits", [("tiny_moe_4bit_path", 4), ("tiny_moe_8bit_path", 8)])
def test_quantized_variants_quantize_every_layer(fixture, bits, request):
    path = request.getfixturevalue(fixture)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"]["bits"] == bits
    model, _ = mlx_lm.load(str(path))
    names = {type(m).__name__ for _, m in model.named_modules()}
    assert {"QuantizedLinear", "QuantizedEmbedding", "QuantizedSwitchLinear"} <= names
    assert "Linear" not in names  # every Linear had a group-divisible input size


def test_hub_layout_is_converted_by_mlx_lm_with_identical_logits(tiny_moe_path, tiny_hub_layout_path):
    raw = mx.load(str(tiny_hub_layout_path / "model.safetensors"))
    assert any(k.startswith("model.language_model.") for k in raw)
    assert any(k.endswith("experts.gate_up_proj") for k in raw)
    assert any(k.startswith("mtp.") for k in raw) and any(k.startswith("model.visual.") for k in raw)
    mlx_model, tokenizer = mlx_lm.load(str(tiny_moe_path))
    hub_model, _ = mlx_lm.load(str(tiny_hub_layout_path))
    ids = mx.array(_prompt(tokenizer, True))[None]
    assert mx.array_equal(mlx_model(ids), hub_model(ids))


def test_chat_template_follows_enable_thinking_and_drops_old_reasoning(tiny_moe_path):
    _, tokenizer = mlx_lm.load(str(tiny_moe_path))
    on = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=True, tokenize=False)
    off = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False, tokenize=False)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    history = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nfirst"},
        {"role": "user", "content": "two"},
    ]
    text = tokenizer.apply_chat_template(history, add_generation_prompt=True, enable_thinking=True, tokenize=False)
    assert "old reasoning" not in text
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n")
    assert "<|im_start|>assistant\nfirst<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n" in text
    for token in ("<think>", "</think>", "<|im_end|>", "<|im_start|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_generation_is_fast_and_offline(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.process_time()  # this process's CPU time: another suite on the same cores does not count
    path = make_tiny_model(tmp_path / "dense8", kind="dense", bits=8)
    assert time.process_time() - start < 10  # generous: about a second
    model, tokenizer = mlx_lm.load(str(path))
    assert mlx_lm.generate(model, tokenizer, _prompt(tokenizer, False), max_tokens=40) == PLAIN_REPLY


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        make_tiny_model(tmp_path / "x", kind="mamba")
    with pytest.raises(ValueError, match="bits"):
        make_tiny_model(tmp_path / "x", bits=3)
    with pytest.raises(ValueError, match="num_layers"):
        make_tiny_model(tmp_path / "x", num_layers=3)


def _top_shares_under_the_card_preset(path) -> tuple[str, list[float]]:
    """The greedy reply to an agent's follow-up (its tail holds the script's own answer) and, at each step, the
    top token's share of the probability after the thinking preset's penalties and temperature."""
    from mlx_lm.generate import generate_step

    from macapp.core.sampling import make_sampler_and_processors, preset

    model, tokenizer = mlx_lm.load(str(path))
    params = preset(True, "general")
    _, processors = make_sampler_and_processors(params)
    turns = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": PLAIN_REPLY}, {"role": "user", "content": "and again"}]
    prompt = mx.array(_prompt(tokenizer, True, turns))
    reply: list[int] = []
    shares = []
    for token, logprobs in generate_step(prompt, model, max_tokens=40):
        logits = logprobs[None]
        for process in processors:
            logits = process(mx.concatenate([prompt, mx.array(reply, dtype=prompt.dtype)]), logits)
        shares.append(mx.max(mx.softmax(logits[0] / params.temperature)).item())
        reply.append(int(token))
        if int(token) in tokenizer.eos_token_ids:
            break
    return tokenizer.decode(reply[:-1]), shares


def test_a_firm_script_holds_under_the_cards_sampling_where_the_plain_one_wavers(tmp_path):
    plain_reply, plain = _top_shares_under_the_card_preset(make_tiny_model(tmp_path / "plain", kind="dense"))
    firm_reply, firm = _top_shares_under_the_card_preset(make_tiny_model(tmp_path / "firm", kind="dense", firm=True))
    assert plain_reply == firm_reply == THINKING_REPLY
    assert min(firm) > 0.999  # top_p 0.95 keeps only the script's token: the sampled reply is the greedy one
    assert min(plain) < 0.95  # what the agent replays met before (a tool call sampled away one run in a few)
