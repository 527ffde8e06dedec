"""Transformers' Qwen3.5, run in a process of its own: the independent reference for the app's model maths.

torch is kept out of the test environment (`make setup` installs it under `.venv/torch-reference`, appended to
this process's path only): with torch importable every `import mlx_lm` in the suite's processes pays ~2 s
loading it through transformers, and the app bundle never has it. The parent test gets arrays back in a .npz.

    python transformers_qwen35.py logits FOLDER IDS.npy NATIVE OUT.npz  # logits with and without the card's YaRN
    python transformers_qwen35.py yarn FACTOR OUT.npz                  # YaRN inverse frequencies, attention factor

Several jobs in one process (torch and transformers load once), separated by `--`: `logits … OUT1.npz -- yarn 2 OUT2.npz`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TORCH_DIR = Path(sys.prefix) / "torch-reference"


def _hf_model(folder: Path, yarn: bool, native: int):
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    if yarn:  # as the card writes it, independently of macapp.core.long_context
        text["rope_parameters"] = dict(text["rope_parameters"], rope_type="yarn", factor=4.0, original_max_position_embeddings=native)
    if config["model_type"] == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM as Model, Qwen3_5MoeTextConfig as Config
    else:
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM as Model, Qwen3_5TextConfig as Config
    model = Model(Config(**text)).float().eval()
    hub = load_file(str(folder / "model.safetensors"))
    weights = {"model." + k.removeprefix("model.language_model."): v for k, v in hub.items() if k.startswith("model.language_model.")}
    weights.update({k: v for k, v in hub.items() if k.startswith("lm_head.")})
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model


def logits(folder: Path, ids_path: Path, out: Path, native: int) -> None:
    import numpy as np
    import torch

    ids = torch.tensor(np.load(ids_path))
    with torch.no_grad():
        yarn = _hf_model(folder, yarn=True, native=native)(ids).logits.float().numpy()
        plain = _hf_model(folder, yarn=False, native=native)(ids).logits.float().numpy()
    np.savez(out, yarn=yarn, plain=plain)


def real_yarn_parameters(factor: int) -> dict[str, object]:
    """Qwen3.5's real rope (head dim 256, partial rotary 0.25, theta 1e7, 262,144 native) with YaRN ×`factor`, as
    the card writes it: what both sides of the frequency check are given."""
    return {
        "rope_type": "yarn",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "factor": float(factor),
        "original_max_position_embeddings": 262_144,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    }


def yarn_parameters(factor: int, out: Path) -> None:
    import numpy as np
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.qwen3_5 import Qwen3_5TextConfig

    params = real_yarn_parameters(factor)
    config = Qwen3_5TextConfig(head_dim=256, hidden_size=2048, num_attention_heads=16, max_position_embeddings=262_144, rope_parameters=params)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    np.savez(out, inv_freq=inv_freq.numpy(), attention_factor=np.float64(attention_factor))


def main(argv: list[str]) -> None:
    sys.path.append(str(TORCH_DIR))  # after site-packages: the venv's own packages win, torch fills the gap
    import torch  # noqa: F401  (before transformers, which decides once whether torch is there)

    jobs: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            jobs.append([])
        else:
            jobs[-1].append(arg)
    for job in jobs:
        match job:
            case ["logits", folder, ids, native, out]:
                logits(Path(folder), Path(ids), Path(out), int(native))
            case ["yarn", factor, out]:
                yarn_parameters(int(factor), Path(out))
            case _:
                raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
