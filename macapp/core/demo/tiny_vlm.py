"""A tiny random-weights Qwen3.5 WITH a vision tower, built from mlx-vlm's own classes, for tests and the bundle.

`make_tiny_vlm(dest, kind="dense"|"moe", seed=0)` writes, in about a second and without network, a folder that
`mlx_vlm.load(dest)` loads with its vision tower and processor, and that `mlx_lm.load(dest)` loads text-only (its
`sanitize` drops ``vision_tower.*``), the way one real download serves both paths:

- The text part is `macapp.core.demo.tiny_model`'s model with the same seed (so it follows the same greedy
  script under mlx-lm), its weights copied into `mlx_vlm.models.qwen3_5.Model` / ``qwen3_5_moe.Model`` built
  with ``ModelConfig.from_dict``; the vision tower is that class's own random initialisation (a small
  `VISION_CONFIG`: 16-pixel patches, 2x2 merge, 2-frame temporal patch, ``out_hidden_size`` = the text hidden size).
- model.safetensors in MLX layout (``language_model.*`` + ``vision_tower.*``) with a model.safetensors.index.json
  whose weight map names every tensor, as the hub's MLX conversions do.
- The tiny tokenizer plus ``<|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|>`` (their ids in
  config.json), a chat template that renders image parts as ``<|vision_start|><|image_pad|><|vision_end|>``
  like Qwen3.5's, preprocessor_config.json / video_preprocessor_config.json naming ``Qwen2VLImageProcessorFast`` /
  ``Qwen3VLProcessor`` with matching patch/merge sizes and a small pixel range (`MAX_PIXELS`), so a bigger
  picture gives more image tokens: a W x H picture inside the range gives about W*H / 32**2 image tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core.jsonvalue import JSONObject
from macapp.core.demo import tiny_model

if TYPE_CHECKING:
    import mlx.nn as nn

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH_SIZE = 16
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 32 * 32  # one image token at least
MAX_PIXELS = 256 * 256  # at most 64 image tokens: the processor scales anything bigger down to this

VISION_CONFIG: JSONObject = {
    "depth": 2,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "in_channels": 3,
    "intermediate_size": 128,
    "num_heads": 2,
    "num_position_embeddings": 576,  # a 24 x 24 grid, interpolated like the real 48 x 48 one
    "patch_size": PATCH_SIZE,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    "deepstack_visual_indexes": [],
}

_IMAGE_PART = "<|vision_start|><|image_pad|><|vision_end|>"
_VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
# Qwen3.5 renders a message's content list in order: text as is, each image as its vision block.
_RENDER_CONTENT = (
    "{%- if message.content is string %}{%- set content = message.content %}"
    "{%- else %}{%- set parts = namespace(text='') %}"
    "{%- for item in message.content %}"
    "{%- if item.type == 'image' or item.type == 'image_url' %}{%- set parts.text = parts.text + '" + _IMAGE_PART + "' %}"
    "{%- elif item.type == 'video' %}{%- set parts.text = parts.text + '" + _VIDEO_PART + "' %}"
    "{%- elif item.type == 'text' %}{%- set parts.text = parts.text + item.text %}"
    "{%- endif %}{%- endfor %}{%- set content = parts.text %}{%- endif %}"
)
CHAT_TEMPLATE = tiny_model.CHAT_TEMPLATE.replace("{%- set content = message.content if message.content is string else '' %}", _RENDER_CONTENT)
assert CHAT_TEMPLATE != tiny_model.CHAT_TEMPLATE  # the text template changed shape: update _RENDER_CONTENT's anchor


def _processor_files(dest: Path) -> None:
    image = {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255,
        "patch_size": PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    }
    (dest / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    video = dict(image, video_processor_type="Qwen3VLVideoProcessor", fps=2, min_frames=4, max_frames=16)
    video.pop("image_processor_type")
    (dest / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))


def _add_vision_tokens(dest: Path) -> dict[str, int]:
    """Add the vision special tokens to the tiny tokenizer already in `dest`; their ids (after the text ones)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(dest / "tokenizer.json"))
    ids = {t: tiny_model.token_id(tok, t) for t in VISION_TOKENS}
    config_file = dest / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    for token, token_id in ids.items():
        config["added_tokens_decoder"][str(token_id)] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config, indent=2))
    return ids


def vlm_config(text_folder_config: JSONObject, ids: dict[str, int]) -> JSONObject:
    """The full config.json: the text model's, a real-shaped `vision_config` and the vision token ids."""
    config = dict(text_folder_config)
    text = config["text_config"]
    if not isinstance(text, dict):
        raise ValueError("config.json has no text_config")
    config["vision_config"] = dict(VISION_CONFIG, model_type=config["model_type"], out_hidden_size=text["hidden_size"])
    config.update(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        vocab_size=text["vocab_size"],
    )
    return config


def make_tiny_vlm(dest: Path, kind: str = "dense", *, seed: int = 0, hidden_size: int = 64, num_layers: int = 4) -> Path:
    """Write a tiny random-weights Qwen3.5 with a vision tower at `dest` and return `dest`."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten

    dest = tiny_model.make_tiny_model(Path(dest), kind=kind, seed=seed, hidden_size=hidden_size, num_layers=num_layers)
    text_model = mlx_lm.load(str(dest))[0]  # (model, tokenizer)
    text_weights = dict(tree_flatten(text_model.parameters()))
    ids = _add_vision_tokens(dest)
    config = vlm_config(json.loads((dest / "config.json").read_text()), ids)

    model = _vlm_model(config, seed)
    model.language_model.load_weights([(k.removeprefix("language_model."), v) for k, v in text_weights.items()], strict=True)
    mx.eval(model.parameters())
    weights = dict(tree_flatten(model.parameters()))
    for old in dest.glob("model*.safetensors*"):
        old.unlink()
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    index = {
        "metadata": {"total_size": sum(v.nbytes for v in weights.values())},
        "weight_map": {k: "model.safetensors" for k in sorted(weights)},
    }
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    _processor_files(dest)
    return dest


def _vlm_model(config: JSONObject, seed: int) -> nn.Module:
    import mlx.core as mx
    from mlx_vlm.models import qwen3_5, qwen3_5_moe

    mx.random.seed(seed + 7)
    if config["model_type"] == "qwen3_5_moe":
        return qwen3_5_moe.Model(qwen3_5_moe.ModelConfig.from_dict(config))
    return qwen3_5.Model(qwen3_5.ModelConfig.from_dict(config))


def main(argv: list[str] | None = None) -> int:
    """`python -m macapp.core.demo.tiny_vlm DEST [--kind dense|moe] [--seed N]`."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--kind", choices=["dense", "moe"], default="dense")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args(argv)
    print(make_tiny_vlm(args.dest, args.kind, seed=args.seed, hidden_size=args.hidden_size, num_layers=args.num_layers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
