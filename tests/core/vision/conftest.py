"""The vision fixtures, and one engine with the tiny vision model per test module."""

from __future__ import annotations

import pytest

from macapp.core.engine import Engine
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT
from tests.fixtures.vision import picture, tiny_vlm_moe_path, tiny_vlm_path, tiny_vlm_text_only_path  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def engine(tiny_vlm_path):
    e = Engine()
    e.load(str(tiny_vlm_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


@pytest.fixture(scope="module")
def long_reply(engine):
    """Greedy, end tokens banned: 24 context-dependent tokens, so a picture that did not arrive shows."""
    vocab = engine.model.tokenizer.get_vocab()
    return greedy(24, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})
