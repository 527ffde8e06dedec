"""Long-context mode checked against an implementation nobody here wrote: Hugging Face transformers' Qwen3.5.

A tiny Qwen3.5 (real architecture, hub checkpoint layout) with a native length of 512 tokens is loaded the way
the app loads it for a 1,500-token context (YaRN ×4, in memory) and read through its prompt cache in chunks;
transformers' own Qwen3.5 model, configured as the model card says (`rope_type: "yarn"`, `factor: 4`,
`original_max_position_embeddings`), reads the same tokens on the same weights. Their logits must agree to
float tolerance at every position, past the native length included.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from macapp.core import long_context
from macapp.core.engine.model_folder import check_model_folder, load_model
from tests.reference import transformers_qwen35 as reference

NATIVE = 512
CONTEXT = 1500  # factor 2 reaches 1,024: the app must pick 4
TOKENS = 1100
TOLERANCE = 1e-4  # float32 on both sides; the observed gap is ~5e-6


def _transformers(tmp_path: Path, *args: str) -> dict[str, np.ndarray]:
    """Run the reference script (transformers + torch, in its own process) and read the arrays it wrote."""
    assert (reference.TORCH_DIR / "torch").is_dir(), f"torch for the reference is not installed in {reference.TORCH_DIR}: run `make setup`"
    out = tmp_path / "reference.npz"
    done = subprocess.run([sys.executable, reference.__file__, *args, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as arrays:
        return dict(arrays)


def _app_logits(folder, ids: np.ndarray) -> np.ndarray:
    """Logits as the app reads a prompt: loaded for CONTEXT tokens, fed through the prompt cache in chunks."""
    from mlx_lm.models.cache import make_prompt_cache

    loaded = load_model(folder, check_model_folder(folder), context=CONTEXT)
    assert loaded.info.yarn_factor == 4 and loaded.info.native_context == NATIVE
    assert loaded.info.max_context == long_context.yarn_longest(NATIVE, 4) >= CONTEXT
    assert json.loads((folder / "config.json").read_text())["text_config"]["rope_parameters"]["rope_type"] == "default"  # file untouched
    cache = make_prompt_cache(loaded.model)
    parts = []
    for start in range(0, ids.shape[1], 400):
        out = loaded.model(mx.array(ids[:, start : start + 400]), cache=cache)
        parts.append(np.array(out.astype(mx.float32)))
    return np.concatenate(parts, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_yarn_logits_match_transformers_past_the_native_length(kind, tiny_short_native_hub_paths, tmp_path):
    folder = tiny_short_native_hub_paths[kind]
    ids = np.random.default_rng(7).integers(0, 448, size=(1, TOKENS))
    ours = _app_logits(folder, ids)
    np.save(tmp_path / "ids.npy", ids)
    theirs = _transformers(tmp_path, "logits", str(folder), str(tmp_path / "ids.npy"), str(NATIVE))
    reference, plain = theirs["yarn"], theirs["plain"]
    gap = np.abs(ours - reference)
    print(f"{kind}: max |mlx-lm - transformers| = {gap.max():.2e} (past native {gap[0, NATIVE:].max():.2e})")
    assert gap[0, NATIVE:].max() < TOLERANCE and gap.max() < TOLERANCE
    # the check can fail: without YaRN the same weights give visibly different logits
    assert np.abs(ours - plain)[0, NATIVE:].max() > 100 * TOLERANCE


@pytest.mark.parametrize("factor", [2, 4])
def test_yarn_frequencies_and_attention_factor_match_transformers_at_the_real_shapes(factor, tmp_path):
    """Qwen3.5's real rope (head dim 256, partial rotary 0.25, theta 1e7, 262,144 native): mlx-lm's YarnRoPE
    against transformers' _compute_yarn_parameters, no model needed."""
    from mlx_lm.models.rope_utils import initialize_rope

    params = reference.real_yarn_parameters(factor)
    theirs = _transformers(tmp_path, "yarn", str(factor))
    inv_freq, attention_factor = theirs["inv_freq"], float(theirs["attention_factor"])
    rope = initialize_rope(64, base=10_000_000, traditional=False, scaling_config=dict(params, type="yarn"), max_position_embeddings=262_144 * factor)
    assert type(rope).__name__ == "YarnRoPE"
    np.testing.assert_allclose(1.0 / np.array(rope._freqs), inv_freq, rtol=1e-5)
    assert math.isclose(rope.mscale, attention_factor, rel_tol=1e-9)  # on q and k's rotated dims: scores × factor²


def test_a_stale_type_key_would_hide_yarn_from_mlx_lm_and_the_app_sets_both():
    from mlx_lm.models.qwen3_5 import TextModelArgs

    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": NATIVE,
        "rope_parameters": {"type": "default", "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    }
    edited = dict(text, rope_parameters=dict(text["rope_parameters"], rope_type="yarn", factor=4.0, original_max_position_embeddings=NATIVE))
    assert TextModelArgs.from_dict(edited).rope_scaling["type"] == "default"  # a card-style edit is silently ignored
    ours = long_context.with_yarn({"text_config": text}, 4, NATIVE)["text_config"]
    assert TextModelArgs.from_dict(ours).rope_scaling["type"] == "yarn"
    assert text["rope_parameters"]["rope_type"] == "default"  # the config given is not changed
