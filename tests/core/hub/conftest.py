"""An original-layout Qwen3.5 repo with an MTP head, and an MLX build of it without one, on the hub stand-in.

The original is the tiny model in the Hugging Face layout (macapp/devtools/tiny_model.py) with a complete, random
bf16 MTP head (the tensor names of the real checkpoints), split over two shards so the head sits in both; the build
is the tiny model's 4-bit MLX conversion, which (like mlx-lm's) has no `mtp.*` tensors, with a model card naming
the original as its base_model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

ORIGINAL = "Qwen/Tiny-Qwen3.5-Dense"
BUILD = "mlx-community/Tiny-Qwen3.5-Dense-4bit"


@dataclass(frozen=True)
class MtpRepos:
    original_files: dict[str, bytes]
    head: dict  # name -> mx.array: the head as the original stores it
    build_files: dict[str, bytes]


def mtp_head(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, seed: int = 7) -> dict:
    import mlx.core as mx

    key = mx.random.key(seed)
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mtp.layers.0.self_attn.q_norm.weight": (head_dim,),
        "mtp.layers.0.self_attn.k_norm.weight": (head_dim,),
        "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.mlp.gate_proj.weight": (intermediate, hidden),
        "mtp.layers.0.mlp.up_proj.weight": (intermediate, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, intermediate),
        "mtp.norm.weight": (hidden,),
    }
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        out[name] = (mx.random.normal(shape, key=mx.random.split(key, len(shapes))[i]) * 0.05).astype(mx.bfloat16)
    mx.eval(list(out.values()))
    return out


def _original(tmp: Path) -> tuple[dict[str, bytes], dict]:
    import json

    import mlx.core as mx

    from macapp.devtools.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp / "original", kind="dense", hub_layout=True)
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    weights = {k: v.astype(mx.bfloat16) for k, v in mx.load(str(folder / "model.safetensors")).items() if not k.startswith("mtp.")}
    head = mtp_head(text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"], text["intermediate_size"])
    names = sorted(head)
    first = {**{k: v for k, v in weights.items() if "layers.0." in k or "layers.1." in k}, **{k: head[k] for k in names[: len(names) // 2]}}
    second = {**{k: v for k, v in weights.items() if k not in first}, **{k: head[k] for k in names[len(names) // 2:]}}
    files = {}
    for i, part in enumerate((first, second), 1):
        path = tmp / f"model-{i:05d}-of-00002.safetensors"
        mx.save_safetensors(str(path), part, metadata={"format": "pt"})
        files[path.name] = path.read_bytes()
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {k: f"model-{1 if k in first else 2:05d}-of-00002.safetensors"
                                                                      for k in {**first, **second}}}).encode()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        files[name] = (folder / name).read_bytes()
    return files, head


def _build(tmp: Path) -> dict[str, bytes]:
    from macapp.devtools.tiny_model import make_tiny_model

    folder = make_tiny_model(tmp / "build", kind="dense", bits=4)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    files["README.md"] = f"---\nlibrary_name: mlx\nbase_model: {ORIGINAL}\ntags:\n- mlx\n---\n# a 4-bit build\n".encode()
    return files


@pytest.fixture(scope="session")
def mtp_repos(tmp_path_factory) -> MtpRepos:
    tmp = tmp_path_factory.mktemp("mtp_repos")
    files, head = _original(tmp)
    return MtpRepos(original_files=files, head=head, build_files=_build(tmp))


@pytest.fixture
def served(hub_server, mtp_repos):
    hub_server.add_repo(ORIGINAL, mtp_repos.original_files)
    hub_server.add_repo(BUILD, mtp_repos.build_files)
    return hub_server


@pytest.fixture
def build_folder(served) -> Path:
    """The build downloaded into the HF cache by the app's own downloader (its snapshot folder)."""
    from macapp.core.download import download

    return download(BUILD).path
