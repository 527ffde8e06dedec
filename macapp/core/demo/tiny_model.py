"""Tiny random-weights Qwen3.5 models (real architecture, real mlx-lm classes) for tests and benchmarks.

`make_tiny_model(dest, kind="moe"|"dense", bits=None|4|8, hub_layout=False)` writes, in about a second
and without network, a folder that `mlx_lm.load(dest)` loads:

- config.json with model_type ``qwen3_5_moe`` / ``qwen3_5`` and a nested ``text_config``: Gated DeltaNet
  and full-attention layers in the real 3:1 pattern (``full_attention_interval`` 4; ``num_layers=2`` gives one of
  each, for tests that read prompts of tens of thousands of tokens: the CPU steps DeltaNet token by token), gated attention,
  partial rotary 0.25, MoE with a shared expert (moe kind). Every matrix dimension is a multiple of 64,
  so 4-bit/8-bit affine quantization (group 64) applies to every layer, as in the real repos.
- model.safetensors built by mlx-lm's own `Model` class (``macapp.core.upstream.text_model_classes``) and saved with
  `save_model` / `save_config`; ``bits`` quantizes it with `quantize_model` (router gates 8-bit like upstream).
- ``hub_layout=True`` writes the Hugging Face checkpoint layout instead (``model.language_model.*`` keys,
  fused ``experts.gate_up_proj``, conv1d as (C, 1, K), zero-centred norms, plus ``mtp.*`` and
  ``model.visual.*`` weights that must be dropped) so mlx-lm's ``sanitize`` conversion path runs on load.
  Its logits are identical to the MLX-layout model made with the same seed.
- A byte-level BPE tokenizer trained in-process (special tokens ``<|endoftext|> <|im_start|> <|im_end|>
  <think> </think>``), tokenizer_config.json with a Qwen3.5-style Jinja chat template honouring
  ``enable_thinking`` and dropping earlier turns' reasoning, generation_config.json with both eos ids.

Scripted behaviour, so tests can rely on it: the weights are random, but the embedding / lm_head carry a
deterministic "successor" script. Under greedy decoding the model answers a thinking-on prompt (ending in
``<think>\\n``) with `SCRIPT_REASONING`, then ``</think>``, ``\\n\\n``, `SCRIPT_ANSWER` and ``<|im_end|>``;
a thinking-off prompt (ending in ``</think>\\n\\n``) gets `SCRIPT_ANSWER` then ``<|im_end|>``. The layers
still add a context-dependent part to every logit (a cache bug changes the logits), and a logit bias
against ``<|im_end|>`` (or a high temperature) sends it off the script into long random text.

MTP heads (``mtp=``; default None writes none, and the files are as before): `mtp.*` tensors of the real
Qwen3.5 layout (mlx-vlm's Qwen3.5 MTP drafter's shapes, the original checkpoint's names, zero-centred norms,
quantized like the build), in the build's model.safetensors or, with ``mtp_side=True``, in
`modelfiles.mtp_side_file(dest)` (as a fetched head is kept). Three heads:

- ``"random"``: random weights: the worst case (its drafts are almost never right).
- ``"successor"``: a head built to draft the script's successor of a token: `fc` passes the token's embedding
  through and drops the hidden half, its layer writes nothing into the residual (o_proj and down_proj zero:
  it still runs, at its real cost), so its output is the normed embedding and the shared lm_head's script rows
  give the successor. Right on the script, wrong off it: a mixed acceptance.
- ``"right"``: the same head on a model whose script is a cycle through every ordinary token (the reasoning
  and answer scripts first, never ``<|im_end|>``) and whose layers write little into the residual, so the
  model's greedy next token is the successor of the token before it, whatever the context: the head is
  right at every step (the upper bound). Its logits still depend on the context; replies run to max_tokens.

``firm=True`` keeps the script under the model card's sampling, not only greedy: a stronger successor (the
"right" model's) over the same layers. For models that answer requests sent as agents send them, with no
sampling fields, so the server's thinking preset applies (temperature 1.0 and a presence penalty of 1.5 over
the prompt's tail, which holds the script's own tokens in an agent's follow-up): with the ordinary margin the
top token's share fell to about 0.5 there, and a test of the reply's tool call failed one run in a few.

``after_tool=[...]``: a second answer script, for a model that reads its tools' results: the reply is `answer`
(say, a tool call) while the prompt holds no ``<tool_response>`` (made one token, as in Qwen3.5's vocabulary), and
`after_tool` once it holds one. The branch is built, not learned: hidden dimension 0 is left out of every
embedding but ``<tool_response>``'s and out of every layer's writes; the full-attention layer's only query (at
the branch token ``\n\n``) and only key read it, so that layer looks at a ``<tool_response>`` when there is one and
writes dimension 0, which lowers the first answer token's logit below `after_tool`'s first. Only the
full-attention layer's query/key are set; everything else stays as above (random, context-dependent).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core import upstream
from macapp.core.modelfiles import mtp_side_file

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn
    from tokenizers import Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
TOKENIZER_VOCAB = 448  # trained BPE size (specials included); the model's vocab is padded to 512.
MODEL_VOCAB = 512
MTP_HEADS = ("random", "successor", "right")
CYCLE_WRITE_SCALE = 0.25  # the "right" model's layers: their writes stay well under the successor's margin
SCRIPT_MARGIN, FIRM_SCRIPT_MARGIN = 1.6, 4.0  # the successor's weight in lm_head (module docstring: ``firm``)
TOOL_RESPONSE = "<tool_response>"
# `after_tool` (module docstring): the first answer token's lead at the branch without a <tool_response> (times
# its successor weight) and what the attention's dimension 0 takes off it with one (measured: a lead of ~6 logits becomes ~7 behind).
BRANCH_LEAD, BRANCH_SWING = 0.25, 4.0

# Greedy script: each word is one token of the tiny tokenizer (checked when the model is built).
# Every token of the script is distinct, so each one has a single successor.
SCRIPT_REASONING = ["Let", " me", " think", " about", " this", " question", " very", " carefully", " first", "."]
SCRIPT_ANSWER = ["The", " answer", " is", " here", "!"]

# The tool parts follow Qwen3.5's own template: tools listed in the system turn, assistant calls written as
# <tool_call><function=NAME><parameter=P>… from a mapping (`arguments|items`), consecutive tool results grouped
# into one user turn of <tool_response> blocks. Without tools the output is unchanged.
CHAT_TEMPLATE = (
    "{%- if tools and tools is iterable and tools is not mapping %}"
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:"
    "\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1"
    "\\n</parameter>\\n</function>\\n</tool_call>' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- '\\n\\n' + messages[0].content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query_index=-1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}"
    "{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- elif content | trim %}{{- '\\n\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for args_name, args_value in (tool_call.arguments or {}) | items %}"
    "{%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}"
    "{{- '<parameter=' + args_name + '>\\n' + args_value + '\\n</parameter>\\n' }}"
    "{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

_WORDS = (
    "the a an is are was be to of and in on at for with by from this that these those it its as "
    "answer question think me let step here there what why how when where who which model local "
    "chat reply reason thought token cache memory speed fast slow small large apple silicon mac "
    "window text file folder load read write stop start again hello hi thanks please yes no maybe "
    "one two three four five six seven eight nine ten number first second last next time day "
    "good bad better best right wrong true false simple hard easy code python test engine stream very carefully"
).split()


def _corpus(seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(600):
        n = rng.randint(3, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        sep = rng.choice([". ", "? ", "!\n", ".\n\n", ", ", ":\n"])
        lines.append(" ".join(words) + sep)
    text = "".join(lines)
    return [text[i : i + 400] for i in range(0, len(text), 400)] + ["".join(SCRIPT_REASONING) + "\n\n" + "".join(SCRIPT_ANSWER) + "\n\n"] * 50


def _train_tokenizer(seed: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok


def _text_config(kind: str, hidden_size: int, num_layers: int) -> dict[str, object]:
    if hidden_size % 64 or (num_layers % 4 and num_layers != 2):
        raise ValueError("hidden_size must be a multiple of 64 and num_layers 2 or a multiple of 4")
    interval = min(4, num_layers)
    heads = max(2, hidden_size // 64)
    cfg: dict[str, object] = {
        "model_type": "qwen3_5_moe_text" if kind == "moe" else "qwen3_5_text",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "full_attention_interval": interval,
        "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)],
        "num_attention_heads": heads,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "attn_output_gate": True,
        "attention_bias": False,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "rms_norm_eps": 1e-6,
        "vocab_size": MODEL_VOCAB,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "dtype": "float32",
        "eos_token_id": None,  # filled in with the tokenizer's ids
        "mtp_num_hidden_layers": 1,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "partial_rotary_factor": 0.25,
    }
    if kind == "moe":
        cfg.update(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
        )
    else:
        cfg.update(intermediate_size=2 * hidden_size)
    return cfg


def _full_config(kind: str, text_config: dict[str, object], eos_ids: list[int]) -> dict[str, object]:
    text_config = dict(text_config, eos_token_id=eos_ids[1])
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if kind == "moe" else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if kind == "moe" else "qwen3_5",
        "text_config": text_config,
        "tie_word_embeddings": False,
        "eos_token_id": eos_ids,
        "vision_config": {"depth": 1, "hidden_size": 64, "model_type": text_config["model_type"]},
    }


def _add_script_tokens(tokenizer: Tokenizer, pieces: list[str]) -> None:
    """Make each piece of a custom script (reasoning or answer) one token (an added token unless BPE already has it)."""
    from tokenizers import AddedToken

    new = [p for p in dict.fromkeys(pieces) if len(tokenizer.encode(p, add_special_tokens=False).ids) != 1]
    tokenizer.add_tokens([AddedToken(p, normalized=False, special=False) for p in new])
    if tokenizer.get_vocab_size() > MODEL_VOCAB:
        raise ValueError(f"the script needs {len(new)} new tokens: more than the model's vocabulary holds")


def token_id(tokenizer: Tokenizer, token: str) -> int:
    """The id of a token the tiny tokenizer holds (SPECIAL_TOKENS, the vision ones tiny_vlm adds)."""
    found = tokenizer.token_to_id(token)
    if found is None:
        raise RuntimeError(f"tiny tokenizer: no token {token!r}")
    return found


def _script_ids(
    tokenizer: Tokenizer,
    answer_pieces: list[str] | None = None,
    reasoning_pieces: list[str] | None = None,
    after_tool: list[str] | None = None,
) -> tuple[list[int], list[int], dict[str, int]]:
    special = {t: token_id(tokenizer, t) for t in SPECIAL_TOKENS}

    def one(text: str) -> int:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer: {text!r} is not one token ({ids})")
        return ids[0]

    special["\n"] = one("\n")
    special["\n\n"] = one("\n\n")
    reasoning, answer = [one(w) for w in reasoning_pieces or SCRIPT_REASONING], [one(w) for w in answer_pieces or SCRIPT_ANSWER]
    chain = [special["\n"], *reasoning, special["</think>"], special["\n\n"], *answer, special["<|im_end|>"]]
    chain += [one(w) for w in after_tool or []]  # the second branch's tokens must differ from all of these too
    if len(set(chain)) != len(chain):  # a token twice would have two successors
        raise ValueError("every piece of the reasoning and answer scripts must be a different token")
    return reasoning, answer, special


def _cycle(tokenizer: Tokenizer, chain: list[int], seed: int) -> list[int]:
    """The "right" model's script: `chain` without its final <|im_end|>, then every other ordinary token (in a
    seeded order), then back to the chain's start."""
    import random

    specials = {tokenizer.token_to_id(t) for t in SPECIAL_TOKENS} - {tokenizer.token_to_id("</think>")}
    body = chain[:-1]
    rest = [i for i in range(tokenizer.get_vocab_size()) if i not in specials and i not in set(body)]
    random.Random(seed).shuffle(rest)
    return body + rest + body[:1]


def _shape_weights(
    model: nn.Module,
    tokenizer: Tokenizer,
    seed: int,
    answer_pieces: list[str] | None = None,
    cycle: bool = False,
    firm: bool = False,
    reasoning_pieces: list[str] | None = None,
    after_tool: list[str] | None = None,
) -> None:
    """Give the random model its greedy script (see the module docstring); layers stay random.
    `cycle`: the "right" model's script (every ordinary token has a successor; the layers write less).
    `firm`: the script survives the card's sampling (a stronger successor).
    `after_tool`: the answer once the prompt holds a <tool_response> (module docstring)."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    reasoning, answer, special = _script_ids(tokenizer, answer_pieces, reasoning_pieces, after_tool)
    chain = [special["\n"], *reasoning, special["</think>"], special["\n\n"], *answer, special["<|im_end|>"]]
    if cycle:
        chain = _cycle(tokenizer, chain, seed)
    lm = model.language_model
    hidden = lm.args.hidden_size
    k1, k2, k3 = mx.random.split(mx.random.key(seed + 1), 3)
    embed = mx.random.normal((MODEL_VOCAB, hidden), key=k1)
    branch = [tokenizer.encode(w, add_special_tokens=False).ids[0] for w in after_tool or []]
    if branch:  # dimension 0 is the <tool_response> flag (module docstring)
        flag = mx.zeros((MODEL_VOCAB, hidden)).at[:, 0].add(1.0)
        embed = embed * (1 - flag) + flag * (mx.arange(MODEL_VOCAB) == token_id(tokenizer, TOOL_RESPONSE))[:, None] * 8.0
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head = mx.random.normal((MODEL_VOCAB, hidden), key=k2) * (0.6 / hidden**0.5)
    rows: dict[int, list[int]] = {}
    for prev, nxt in zip(chain, chain[1:]):
        rows.setdefault(nxt, []).append(prev)
    if branch:
        for prev, nxt in zip([special["\n\n"], *branch], [*branch, special["<|im_end|>"]]):
            rows.setdefault(nxt, []).append(prev)
    margin = FIRM_SCRIPT_MARGIN if cycle or firm else SCRIPT_MARGIN
    head_rows = [head[i] for i in range(MODEL_VOCAB)]
    for nxt, prevs in rows.items():
        head_rows[nxt] = head_rows[nxt] + margin * sum(unit[p] for p in prevs)
    if branch:
        first = answer[0]
        dim0 = mx.zeros((hidden,)).at[0].add(1.0)
        head_rows[first] = head_rows[first] + BRANCH_LEAD * margin * unit[special["\n\n"]] - BRANCH_SWING * dim0
    lm.model.embed_tokens.weight = embed
    lm.lm_head.weight = mx.stack(head_rows)
    # Scale what each block writes into the residual stream: the script survives and context still counts.
    updates = []
    for path, value in _flat_arrays(lm.model.parameters()):
        if path.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            value = value * (CYCLE_WRITE_SCALE if cycle else 2.5)
            updates.append((path, value.at[0].multiply(0.0) if branch else value))
    lm.model.update(tree_unflatten(updates))
    if branch:
        _tool_response_attention(lm, unit[special["\n\n"]])
    # Slow DeltaNet decay (mlx-lm draws A in [0, 16]: the state forgets within a token or two), so the
    # recurrent state carries the conversation and a wrongly restored cache shows in the logits.
    for layer in lm.model.layers:
        if layer.is_linear:
            shape = layer.linear_attn.A_log.shape
            layer.linear_attn.A_log = mx.log(mx.random.uniform(0.05, 0.5, shape, key=k3))


def _tool_response_attention(lm: nn.Module, query_dir: mx.array) -> None:
    """The full-attention layer of an `after_tool` model: each head's last query dimension (left out of the rotary
    part) reads `query_dir` (the branch token's), the only key dimension and a value dimension read the
    <tool_response> flag (dimension 0), and o_proj writes that value back to dimension 0 alone."""
    import mlx.core as mx

    attn = next(layer.self_attn for layer in lm.model.layers if not layer.is_linear)
    hidden, head_dim, heads = query_dir.shape[0], attn.head_dim, attn.num_attention_heads
    last = head_dim - 1
    flag = mx.zeros((hidden,)).at[0].add(1.0)
    q = mx.zeros((heads, 2, head_dim, hidden))  # per head: its query rows, then its output gate's (0: a gate of 1/2)
    attn.q_proj.weight = q.at[:, 0, last].add(query_dir).reshape(-1, hidden)
    attn.k_proj.weight = mx.zeros(attn.k_proj.weight.shape).at[last].add(flag)
    attn.v_proj.weight = attn.v_proj.weight.at[last].multiply(0.0).at[last].add(flag)
    attn.k_norm.weight = attn.k_norm.weight * 3.0  # a score of ~24 at a <tool_response>, 0 elsewhere
    o = attn.o_proj.weight.at[:, last::head_dim].multiply(0.0)
    attn.o_proj.weight = o.at[0, last::head_dim].add(1.0)


def _hub_weights(weights: dict[str, mx.array], kind: str, num_layers: int, hidden: int, head: dict[str, mx.array] | None = None) -> dict[str, mx.array]:
    """The Hugging Face checkpoint layout of MLX-layout weights (the inverse of mlx-lm's sanitize)."""
    import mlx.core as mx

    norm_suffixes = (
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    )
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        if "switch_mlp" in key:
            continue
        if key.startswith("language_model.model."):
            new = "model.language_model." + key[len("language_model.model.") :]
        else:
            new = key[len("language_model.") :]
        if "conv1d.weight" in key:
            value = value.moveaxis(2, 1)
        if key.endswith(norm_suffixes) and value.ndim == 1:
            value = value - 1.0
        out[new] = value
    if kind == "moe":
        for layer in range(num_layers):
            p = f"language_model.model.layers.{layer}.mlp.switch_mlp"
            gate, up = weights[f"{p}.gate_proj.weight"], weights[f"{p}.up_proj.weight"]
            hub = f"model.language_model.layers.{layer}.mlp.experts"
            out[f"{hub}.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
            out[f"{hub}.down_proj"] = weights[f"{p}.down_proj.weight"]
    if head is not None:
        out.update(head)
    else:
        out["mtp.fc.weight"] = mx.zeros((hidden, 2 * hidden))
        out["mtp.norm.weight"] = mx.zeros((hidden,))
    out["model.visual.patch_embed.proj.weight"] = mx.zeros((64, 3, 2, 16, 16))
    return out


_ZERO_CENTRED = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


def _mtp_tensors(config: dict[str, object], hidden: int, head: str, bits: int | None) -> dict[str, mx.array]:
    """The `mtp.*` tensors of a tiny head (see the module docstring), quantized like a `bits` build."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import Model, ModelConfig

    drafter = Model(ModelConfig.from_dict({"text_config": config["text_config"]}))
    if head != "random":
        updates = [("fc.weight", mx.concatenate([mx.eye(hidden), mx.zeros((hidden, hidden))], axis=1))]
        for path, value in _flat_arrays(drafter.parameters()):
            if path.endswith(("o_proj.weight", "down_proj.weight")):
                updates.append((path, mx.zeros_like(value)))
        drafter.update(tree_unflatten(updates))
    if bits is not None:  # as mlx-lm's quantize_model does it: the MoE router gates at 8 bits
        gates = ("mlp.gate", "shared_expert_gate")
        nn.quantize(
            drafter,
            class_predicate=lambda p, m: (
                hasattr(m, "to_quantized") and ({"group_size": 64, "bits": 8} if p.endswith(gates) else {"group_size": 64, "bits": bits})
            ),
        )
    out: dict[str, mx.array] = {}
    for path, value in _flat_arrays(drafter.parameters()):
        if path.endswith(_ZERO_CENTRED) and value.ndim == 1:
            value = value - 1.0  # the original checkpoint's convention
        out["mtp." + path] = value
    if bits is None and "mtp.layers.0.mlp.switch_mlp.gate_proj.weight" in out:  # the original fused experts
        p = "mtp.layers.0.mlp.switch_mlp"
        gate, up = out.pop(f"{p}.gate_proj.weight"), out.pop(f"{p}.up_proj.weight")
        out["mtp.layers.0.mlp.experts.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
        out["mtp.layers.0.mlp.experts.down_proj"] = out.pop(f"{p}.down_proj.weight")
    mx.eval(out)
    return out


def _flat_arrays(tree: object) -> list[tuple[str, mx.array]]:
    """mlx.utils.tree_flatten of a module's parameters: its (dotted path, array) pairs."""
    from mlx.utils import tree_flatten

    flat = tree_flatten(tree)
    if not isinstance(flat, list):  # tree_flatten returns its destination, a list unless one is given
        raise TypeError("tree_flatten returned a dict")
    return flat


def _add_to_shard(dest: Path, tensors: dict[str, mx.array]) -> None:
    """Put `tensors` into the build's model.safetensors (and its index), as a conversion that kept them would."""
    import mlx.core as mx

    shard = dest / "model.safetensors"
    loaded = mx.load(str(shard))
    if not isinstance(loaded, dict):  # a .safetensors file loads as a dict of arrays
        raise TypeError(f"{shard} did not load as named arrays")
    weights = dict(loaded)
    weights.update(tensors)
    # Written beside it, then renamed: the loaded arrays are read from the shard lazily, and MLX 0.32.2 empties a file
    # it saves to before it reads them (the MTP fixtures failed on .ci/lowest-constraints.txt).
    partial = shard.with_name("partial-" + shard.name)  # save_safetensors names its file *.safetensors
    mx.save_safetensors(str(partial), weights, metadata={"format": "mlx"})
    partial.replace(shard)
    index = dest / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data.setdefault("weight_map", {}).update({k: shard.name for k in tensors})
        index.write_text(json.dumps(data, indent=4))


def _write_tokenizer(dest: Path, tokenizer: Tokenizer, eos_ids: list[int]) -> None:
    tokenizer.save(str(dest / "tokenizer.json"))
    added = {  # transformers reads the added tokens from here: the answer script's too
        str(i): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.content in SPECIAL_TOKENS and t.content not in ("<think>", "</think>"),
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (dest / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2))
    generation = {
        "bos_token_id": eos_ids[1],
        "do_sample": True,
        "eos_token_id": eos_ids,
        "pad_token_id": eos_ids[1],
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
    }
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2))


def make_tiny_model(
    dest: Path,
    kind: str = "moe",
    bits: int | None = None,
    hub_layout: bool = False,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 4,
    answer: list[str] | None = None,
    reasoning: list[str] | None = None,
    mtp: str | None = None,
    mtp_side: bool = False,
    firm: bool = False,
    after_tool: list[str] | None = None,
) -> Path:
    """Write a tiny random-weights Qwen3.5 model folder at `dest` and return `dest`.

    `answer` replaces SCRIPT_ANSWER with other pieces (each made one token, distinct from every other script
    token): e.g. a tool call, for tests of the API server (tests/fixtures/scripted.py); `reasoning` replaces
    SCRIPT_REASONING the same way (the demo model's words: macapp.core.demo.model).
    `mtp`: one of MTP_HEADS (module docstring), in the build's shard or with `mtp_side` in its side file.
    `firm`: the script holds under the card's sampling too (module docstring).
    `after_tool`: the answer once the prompt holds a <tool_response> (module docstring)."""
    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_config, save_model

    if kind not in ("moe", "dense"):
        raise ValueError(f"kind must be 'moe' or 'dense', not {kind!r}")
    if bits not in (None, 4, 8):
        raise ValueError(f"bits must be None, 4 or 8, not {bits!r}")
    if hub_layout and bits is not None:
        raise ValueError("the hub layout is the unquantized upstream checkpoint; use bits=None")
    if after_tool and (kind != "dense" or mtp is not None):
        raise ValueError("after_tool is built for the dense kind without an MTP head")
    if mtp not in (None, *MTP_HEADS):
        raise ValueError(f"mtp must be None or one of {', '.join(MTP_HEADS)}, not {mtp!r}")
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)

    tokenizer = _train_tokenizer(seed)
    if answer or reasoning or after_tool:
        _add_script_tokens(tokenizer, [*(reasoning or ()), *(answer or ()), *(after_tool or ()), *([TOOL_RESPONSE] if after_tool else [])])
    eos_ids = [token_id(tokenizer, "<|im_end|>"), token_id(tokenizer, "<|endoftext|>")]
    text_config = _text_config(kind, hidden_size, num_layers)
    config = _full_config(kind, text_config, eos_ids)

    mx.random.seed(seed)
    model_class, args_class = upstream.text_model_classes(config)
    model = model_class(args_class.from_dict(config))
    _shape_weights(
        model,
        tokenizer,
        seed,
        list(answer) if answer else None,
        cycle=mtp == "right",
        firm=firm,
        reasoning_pieces=list(reasoning) if reasoning else None,
        after_tool=after_tool,
    )
    mx.eval(model.parameters())
    head = _mtp_tensors(config, hidden_size, mtp, bits) if mtp else None
    shard_head = head if head is not None and not mtp_side else None

    if hub_layout:
        weights = _hub_weights(dict(_flat_arrays(model.parameters())), kind, num_layers, hidden_size, shard_head)
        mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "pt"})
        (dest / "config.json").write_text(json.dumps(config, indent=2))
    else:
        saved = dict(config)
        if bits is not None:
            with contextlib.redirect_stdout(io.StringIO()):  # quantize_model prints a line
                model, saved = quantize_model(model, saved, group_size=64, bits=bits)
        save_model(dest, model)
        save_config(saved, dest / "config.json")
        if shard_head is not None:
            _add_to_shard(dest, shard_head)
    if head is not None and mtp_side:
        mx.save_safetensors(str(mtp_side_file(dest)), head, metadata={"format": "mlx"})
    _write_tokenizer(dest, tokenizer, eos_ids)
    return dest


def main(argv: list[str] | None = None) -> int:
    """`python -m macapp.core.demo.tiny_model DEST [--kind moe|dense] [--bits 4|8] [--hub-layout]`."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--kind", choices=["moe", "dense"], default="moe")
    parser.add_argument("--bits", type=int, choices=[4, 8], default=None)
    parser.add_argument("--hub-layout", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--mtp", choices=MTP_HEADS, default=None, help="write an MTP head (see the module docstring)")
    parser.add_argument("--mtp-side", action="store_true", help="the head in the build's side file, not its shard")
    args = parser.parse_args(argv)
    path = make_tiny_model(
        args.dest,
        args.kind,
        args.bits,
        args.hub_layout,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        mtp=args.mtp,
        mtp_side=args.mtp_side,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
