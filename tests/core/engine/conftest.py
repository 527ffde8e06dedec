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
