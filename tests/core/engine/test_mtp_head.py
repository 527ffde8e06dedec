"""The MTP head's loader (mtp_head.py): where its tensors are found, how they are read, and what they draft."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from macapp.core.engine.mtp_head import MTPHeadError, load_mtp_head, mtp_files
from macapp.core.modelfiles import mtp_side_file

PROMPT = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n<think>\n"


def agreement(m, head, steps: int = 24) -> float:
    """How often the head's first draft is the model's own greedy next token, along the greedy continuation."""
    lm = m.model.language_model
    cache = make_prompt_cache(m.model)
    tokens = m.tokenizer.encode(PROMPT)
    hidden = lm.model(mx.array(tokens)[None], cache=cache)[:, -1:, :]
    token = int(mx.argmax(lm.lm_head(hidden), axis=-1).item())
    right = 0
    for i in range(steps):
        head.drafter.reset(m.model)
        head.drafter.set_shared_kv({}, len(tokens) + i - 1)
        draft = int(head.drafter.draft_block(token, hidden, None, 2, None, greedy=True)[0, 0].item())
        hidden = lm.model(mx.array([[token]]), cache=cache)
        token = int(mx.argmax(lm.lm_head(hidden), axis=-1).item())
        right += draft == token
    return right / steps


@pytest.mark.parametrize(
    "kind,bits,side",
    [("dense", None, False), ("moe", None, False), ("moe", None, True), ("dense", 4, False), ("moe", 4, True), ("moe", 8, False)],
)
def test_the_right_head_loads_from_the_shard_or_the_side_file_quantized_or_not(tiny_mtp, load_tiny, kind, bits, side):
    path = tiny_mtp(kind, "right", bits, side)
    m = load_tiny(path)
    head = m.mtp_head
    assert head is not None and head.target is m.model and m.info.mtp_head_bytes == head.nbytes > 0
    assert head.source == (mtp_side_file(path) if side else path / "model.safetensors")
    assert head.depth == 1
    if bits:  # quantized like the build: the attention projections at the build's bits, the MoE router at 8
        q = head.drafter.layers[0].self_attn.q_proj
        assert (q.bits, q.group_size) == (bits, 64)
        if kind == "moe":
            assert head.drafter.layers[0].mlp.gate.bits == 8
    # zero-centred norms read as the original checkpoint means them: the head drafts the model's next token
    assert agreement(m, head) == 1.0


def test_a_random_head_loads_and_is_almost_never_right(tiny_mtp, load_tiny):
    m = load_tiny(tiny_mtp("moe", "random"))
    assert m.mtp_head is not None
    assert agreement(m, m.mtp_head) <= 0.1


def test_a_build_without_a_head_has_none(tiny_moe_path, load_tiny):
    m = load_tiny(tiny_moe_path)
    assert mtp_files(tiny_moe_path) == [] and m.mtp_head is None and m.info.mtp_head_bytes == 0 and m.mtp_problem == ""


def test_mtp_off_loads_no_head_and_counts_no_memory_for_it(tiny_mtp):
    from macapp.core.engine import Engine
    from macapp.core.engine.options import MTPMode

    folder = tiny_mtp("moe", "right")
    engine = Engine()
    try:
        with_head = engine.load(str(folder)).result(timeout=120)
        head = engine.model.mtp_head
        assert head is not None and with_head.mtp_head_bytes == head.nbytes > 0
        del head
        without = engine.load(str(folder), mtp=MTPMode.OFF).result(timeout=120)
        assert engine.model.mtp_head is None and engine.model.mtp_problem == "" and without.mtp_head_bytes == 0
        assert without.memory_bytes <= with_head.memory_bytes - with_head.mtp_head_bytes // 2  # the head's bytes were never read
        assert engine.load(str(folder), mtp=MTPMode.ON).result(timeout=120).mtp_head_bytes == with_head.mtp_head_bytes
    finally:
        engine.close()


def test_a_head_that_does_not_fit_the_model_is_refused_with_its_reason(tiny_mtp, tiny_moe_path, load_tiny, tmp_path):
    import shutil

    from macapp.core.engine.model_folder import check_model_folder, load_model

    folder = tmp_path / "build"
    shutil.copytree(tiny_moe_path, folder)
    other = load_tiny(tiny_mtp("dense", "random"))  # dense head: no experts, where the MoE model needs them
    side = mtp_side_file(folder)
    mx.save_safetensors(str(side), {k: v for k, v in mx.load(str(other.path / "model.safetensors")).items() if k.startswith("mtp.")})
    assert mtp_files(folder) == [side]
    with pytest.raises(MTPHeadError, match="does not fit"):
        load_mtp_head(load_tiny(tiny_moe_path), folder)
    m = load_model(folder, check_model_folder(folder))  # the model loads; decoding is plain, and why is kept
    assert m.mtp_head is None and "does not fit" in m.mtp_problem


def test_the_shards_win_over_the_side_file(tiny_mtp, tmp_path):
    import shutil

    folder = tmp_path / "build"
    shutil.copytree(tiny_mtp("dense", "right"), folder)
    mtp_side_file(folder).write_bytes(b"not read")
    assert mtp_files(folder) == [folder / "model.safetensors"]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_a_head_quantized_by_the_fetch_loads_from_the_side_file(tiny_mtp, load_tiny, tmp_path, kind):
    """The contract with the fetch (macapp.core.hub.mtp_quant): the original names and zero-centred norms,
    quantized as mlx-lm would (only `.weight` tensors: the fused experts of the original stay as they are)."""
    import shutil

    from macapp.core.engine.model_folder import check_model_folder, load_model
    from macapp.core.hub.mtp_quant import QuantRule

    source = tiny_mtp(kind, "right")  # its head, in the original layout (the fused experts unquantized)
    folder = tmp_path / "build"
    shutil.copytree(source, folder)
    shard = folder / "model.safetensors"
    weights = mx.load(str(source / "model.safetensors"))  # not the copy: it is written over below
    head = {k: v for k, v in weights.items() if k.startswith("mtp.")}
    mx.save_safetensors(str(shard), {k: v for k, v in weights.items() if not k.startswith("mtp.")}, metadata={"format": "mlx"})
    quantized = QuantRule(bits=4, group_size=64, dtype="F32", moe=kind == "moe").quantize(head)
    mx.save_safetensors(str(mtp_side_file(folder)), quantized)
    m = load_model(folder, check_model_folder(folder))
    assert m.mtp_head is not None and m.mtp_head.source == mtp_side_file(folder)
    assert m.mtp_head.drafter.layers[0].self_attn.q_proj.bits == 4
    assert agreement(m, m.mtp_head) == 1.0
