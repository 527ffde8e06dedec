"""Engine fixtures: one engine with the tiny MoE model for the package, and sampling settings built on its vocab."""

from __future__ import annotations

import pytest

from macapp.core.engine import Engine
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT


@pytest.fixture(scope="package")
def engine(tiny_moe_path):
    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


@pytest.fixture(scope="package")
def ids(engine):
    vocab = engine.model.tokenizer.get_vocab()
    return {t: vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "</think>")}


@pytest.fixture(scope="package")
def off_script(ids):
    """Greedy, but <|im_end|> and <|endoftext|> are banned: long, context-dependent text (mlx-lm's logit bias)."""
    return greedy(40, logit_bias={ids["<|im_end|>"]: -1e9, ids["<|endoftext|>"]: -1e9})


@pytest.fixture(scope="session")
def tiny_mtp(tiny_models_dir):
    """`tiny_mtp(kind, head, bits=None, side=False, answer=None)`: the folder of a tiny model with an MTP head
    (macapp.core.demo.tiny_model: "random", "successor" or "right"), built once per session."""
    from macapp.core.demo.tiny_model import make_tiny_model

    built: dict = {}

    def make(kind: str, head: str, bits: int | None = None, side: bool = False, answer: tuple | None = None):
        key = (kind, head, bits, side, answer)
        if key not in built:
            name = f"mtp-{kind}-{head}-{bits or 'f32'}{'-side' if side else ''}{'-tool' if answer else ''}"
            built[key] = make_tiny_model(tiny_models_dir / name, kind, bits, mtp=head, mtp_side=side, answer=list(answer) if answer else None)
        return built[key]

    return make


@pytest.fixture(scope="session")
def load_tiny():
    """`load_tiny(path)`: the LoadedModel of a tiny model folder (model_folder.load_model, no engine), cached."""
    from macapp.core.engine.model_folder import check_model_folder, load_model

    loaded: dict = {}

    def load(path):
        if path not in loaded:
            loaded[path] = load_model(path, check_model_folder(path))
        return loaded[path]

    return load
