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
IDS = np.random.default_rng(7).integers(0, 448, size=(1, TOKENS))
FACTORS = (2, 4)


@pytest.fixture(scope="module")
def theirs(tiny_short_native_hub_paths, tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """Transformers' side of every check below, by name: the reference script (transformers + torch) run once, in
    a process of its own, so torch and transformers load once for the module."""
    assert (reference.TORCH_DIR / "torch").is_dir(), f"torch for the reference is not installed in {reference.TORCH_DIR}: run `make setup`"
    work = tmp_path_factory.mktemp("reference")
    np.save(work / "ids.npy", IDS)
    jobs = {f"logits-{kind}": ["logits", str(folder), str(work / "ids.npy"), str(NATIVE)] for kind, folder in tiny_short_native_hub_paths.items()}
    jobs.update({f"yarn-{factor}": ["yarn", str(factor)] for factor in FACTORS})
    argv = [arg for name, job in jobs.items() for arg in ("--", *job, str(work / f"{name}.npz"))][1:]
    done = subprocess.run([sys.executable, reference.__file__, *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    arrays = {}
    for name in jobs:
        with np.load(work / f"{name}.npz") as saved:
            arrays[name] = dict(saved)
    return arrays


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
def test_yarn_logits_match_transformers_past_the_native_length(kind, tiny_short_native_hub_paths, theirs):
    ours = _app_logits(tiny_short_native_hub_paths[kind], IDS)
    reference, plain = theirs[f"logits-{kind}"]["yarn"], theirs[f"logits-{kind}"]["plain"]
    gap = np.abs(ours - reference)
    print(f"{kind}: max |mlx-lm - transformers| = {gap.max():.2e} (past native {gap[0, NATIVE:].max():.2e})")
    assert gap[0, NATIVE:].max() < TOLERANCE and gap.max() < TOLERANCE
    # the check can fail: without YaRN the same weights give visibly different logits
    assert np.abs(ours - plain)[0, NATIVE:].max() > 100 * TOLERANCE


@pytest.mark.parametrize("factor", FACTORS)
def test_yarn_frequencies_and_attention_factor_match_transformers_at_the_real_shapes(factor, theirs):
    """Qwen3.5's real rope (head dim 256, partial rotary 0.25, theta 1e7, 262,144 native): mlx-lm's YarnRoPE
    against transformers' _compute_yarn_parameters, no model needed."""
    from mlx_lm.models.rope_utils import initialize_rope

    params = reference.real_yarn_parameters(factor)
    inv_freq, attention_factor = theirs[f"yarn-{factor}"]["inv_freq"], float(theirs[f"yarn-{factor}"]["attention_factor"])
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
