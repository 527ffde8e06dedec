"""A prompt that cannot fit is refused before it is tokenized whole; the bounds never refuse one that fits."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macapp.core.sampling import greedy
from macapp.core.serving.bounds import PromptTooLong, check_prompt, max_token_bytes, min_prompt_tokens, pieces, prompt_exceeds
from macapp.core.serving.render import render
from macapp.core.serving.requests import ChatMessage, CompletionRequest, Role


@pytest.fixture(scope="module")
def tokenizer(tiny_dense_path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_dense_path)


def request_of(text: str, **kw) -> CompletionRequest:
    return CompletionRequest(messages=(ChatMessage(Role.USER, text),), sampling=greedy(4), **kw)


def test_max_token_bytes_covers_every_token(tokenizer):
    longest = max_token_bytes(tokenizer)
    assert longest == max(len(t.encode()) for t in tokenizer.get_vocab())
    assert max_token_bytes(tokenizer) is longest or max_token_bytes(tokenizer) == longest


word_text = st.lists(st.sampled_from(list("ab \n.,!é<>|_") + ["the ", "answer ", "<|im_start|>", "<|im_end|>", "\n\n", "e\u0301"]), max_size=150).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=word_text)
def test_the_byte_bound_is_never_above_the_real_count(tokenizer, text):
    request = request_of(text)
    assert min_prompt_tokens(request, max_token_bytes(tokenizer)) <= len(render(tokenizer, request).tokens)


@settings(max_examples=80, deadline=None)
@given(text=word_text, size=st.integers(8, 64))
def test_the_sliced_count_proves_only_what_is_true(tokenizer, text, size):
    real = len(tokenizer.encode(text, add_special_tokens=False))
    assert "".join(pieces(text, size)) == text
    for limit in (real // 2, real - 1, real, real + 5):
        proved = prompt_exceeds(tokenizer, text, limit, size)
        if proved is not None:
            assert proved <= real and real > limit


def test_a_prompt_that_fits_passes(tokenizer):
    check_prompt(tokenizer, request_of("the answer " * 100), 100_000)


def test_a_huge_prompt_is_refused_fast_from_its_bytes(tokenizer):
    start = time.process_time()  # this process's CPU time: another suite on the same cores does not count
    with pytest.raises(PromptTooLong, match="at least") as caught:
        check_prompt(tokenizer, request_of("the answer is here. " * 500_000), 32_768)  # 10 MB
    assert time.process_time() - start < 2 and caught.value.limit == 32_768


def test_a_prompt_over_by_its_tokens_is_refused_after_reading_about_the_limit(tokenizer):
    text = "the answer\n" * 300_000  # 3.3 MB: the byte bound alone does not refuse it at this limit
    limit = len(text.encode()) // max_token_bytes(tokenizer) + 1000
    start = time.process_time()
    with pytest.raises(PromptTooLong) as caught:
        check_prompt(tokenizer, request_of(text), limit)
    assert time.process_time() - start < 10
    assert limit < caught.value.at_least <= len(render(tokenizer, request_of(text)).tokens)


@settings(max_examples=100, deadline=None)
@given(text=word_text, size=st.integers(4, 64))
def test_slices_cut_where_no_token_crosses(tokenizer, text, size):
    whole = len(tokenizer.encode(text, add_special_tokens=False))
    assert sum(len(tokenizer.encode(p, add_special_tokens=False)) for p in pieces(text, size)) == whole
