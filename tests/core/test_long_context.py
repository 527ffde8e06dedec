"""Long-context mode end to end on tiny models: refused where there is no YaRN, and past the native length a
model loads, reads a long prompt with progress, answers, and uses the memory the fit says."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macapp.cli import main
from macapp.core import events as ev
from macapp.core import long_context
from macapp.core.fit import estimate
from macapp.core.catalog import Arch
from macapp.core.engine import Engine, EngineError, SessionOptions
from macapp.core.events import PromptProgress
from macapp.core.sampling import greedy
from macapp.core.demo.tiny_model import make_tiny_model
from tests.fixtures.models import with_native_length

TIMEOUT = 120
NATIVE = 256
CONTEXT = 900  # past ×2 (512): ×4, whose card-proportion limit is 986
MEMORY_TOLERANCE = 0.35  # the reading's own bytes (KV, state, chunk, scores) measured against the fit's


@pytest.fixture(scope="module")
def no_yarn_model(tiny_models_dir):
    return with_native_length(make_tiny_model(tiny_models_dir / "tiny-linear-rope", kind="dense"), 512, rope_type="linear")


@pytest.fixture(scope="module")
def short_native_bf16(tiny_models_dir):
    return with_native_length(make_tiny_model(tiny_models_dir / "tiny-native256-bf16", kind="dense"), NATIVE, bf16=True)


@pytest.mark.parametrize("command", ["chat", "serve", "fit"])
def test_a_context_past_native_is_refused_where_the_model_has_no_yarn(command, capsys, no_yarn_model):
    argv = [command, *(["--model"] if command != "fit" else []), str(no_yarn_model), "--context", "600"]
    code = main(argv + (["--prompt", "hi"] if command == "chat" else []))
    err = capsys.readouterr().err
    assert code == 2
    assert "context 600 is above tiny-linear-rope's native 512 tokens, and long-context mode (YaRN) cannot extend it" in err
    assert "rope_type is 'linear'" in err and "loaded in" not in err


def test_the_engine_refuses_it_too_and_keeps_the_model_it_had(no_yarn_model, tiny_dense_path):
    engine = Engine()
    try:
        engine.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
        with pytest.raises(EngineError) as refused:
            engine.load(str(no_yarn_model), context=600).result(timeout=TIMEOUT)
        assert refused.value.code == ev.CONTEXT_LIMIT and "cannot extend it" in refused.value.message
        assert engine.loaded is not None and engine.loaded.name == tiny_dense_path.name
    finally:
        engine.close()


def test_at_or_below_native_nothing_changes(short_native_bf16):
    engine = Engine()
    try:
        info = engine.load(str(short_native_bf16), context=NATIVE).result(timeout=TIMEOUT)
        assert info.yarn_factor is None and info.max_context == NATIVE
        rope = engine.model.model.layers[3].self_attn.rope
        assert type(rope).__name__ == "RoPE"
    finally:
        engine.close()


def test_blocked_attention_gives_the_same_output_as_one_block():
    from mlx_lm.models.base import create_causal_mask, scaled_dot_product_attention

    q = mx.random.normal((1, 4, 96, 64), key=mx.random.key(1))
    k = mx.random.normal((1, 2, 300, 64), key=mx.random.key(2))
    v = mx.random.normal((1, 2, 300, 64), key=mx.random.key(3))
    for mask in ("causal", create_causal_mask(96, offset=204)):
        whole = scaled_dot_product_attention(q, k, v, None, 0.125, mask)
        blocked = long_context.blocked_attention(q, k, v, None, 0.125, mask, limit=4 * 300 * 2 * 10)  # 10-row blocks
        assert long_context.query_block(4, 96, 300, 4 * 300 * 2 * 10) == 10
        assert mx.abs(whole - blocked).max().item() < 1e-5


@pytest.mark.slow
def test_a_long_prompt_past_native_loads_reads_answers_and_fits_as_estimated(short_native_bf16):
    engine = Engine()
    try:
        info = engine.load(str(short_native_bf16), context=CONTEXT).result(timeout=TIMEOUT)
        assert info.yarn_factor == 4 and info.native_context == NATIVE and info.max_context >= CONTEXT
        assert "YaRN ×4" in long_context.notice(info.yarn_factor)
        assert type(engine.model.model.layers[3].self_attn.rope).__name__ == "YarnRoPE"
        session = engine.new_session(options=SessionOptions(context_limit=CONTEXT, prefill_step_size=256))
        prompt = "the answer is here and there " * 80  # ~650 tokens, past the native 256
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        job = session.send(prompt, thinking=False, sampling=greedy(24))
        events = list(job.events(timeout=TIMEOUT))
        reply = job.result(timeout=TIMEOUT)
        progress = [e for e in events if isinstance(e, PromptProgress)]
        assert len(progress) >= 3 and progress[-1].processed == progress[-1].total  # read in chunks, with progress
        assert reply.stats.prompt_tokens > 2 * NATIVE and reply.stats.generation_tokens > 0 and reply.text.strip()
        used = mx.get_peak_memory() - before
        arch = engine.model.arch
        tokens = session.context_tokens
        fit = estimate.kv_cache_bytes(arch, tokens) + estimate.state_bytes(arch) + estimate.prefill_bytes(arch, tokens, 256)
        # MLX's CPU DeltaNet (no Metal kernel) keeps the float32 state of every position of a chunk; the Metal kernel
        # does not, so the fit leaves it out. At real sizes it is small beside the weights; here it dominates.
        cpu_scan = 256 * arch.linear_num_value_heads * arch.linear_key_head_dim * arch.linear_value_head_dim * 4
        print(f"reading {tokens} tokens: measured {used / 1e6:.2f} MB, fit {fit / 1e6:.2f} MB + CPU scan {cpu_scan / 1e6:.2f} MB")
        assert abs(used - (fit + cpu_scan)) <= MEMORY_TOLERANCE * fit
    finally:
        engine.close()


def test_the_fit_names_long_context_mode_and_searches_past_native():
    arch = Arch(
        model_type="qwen3_5_text",
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        full_attention_interval=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        vocab_size=512,
        max_position_embeddings=986,
        tie_word_embeddings=False,
        intermediate_size=128,
        native_context=NATIVE,
    )
    assert estimate.yarn_factor(arch, NATIVE) is None and estimate.yarn_factor(arch, 300) == 2 and estimate.yarn_factor(arch, CONTEXT) == 4
    # the scores of a chunk against the whole context grow with it; past the block limit they stop growing
    assert estimate.attention_scores_bytes(arch, 2048) > estimate.attention_scores_bytes(arch, 1024)


def test_reading_a_prompt_past_native_can_be_stopped_chat_and_api(short_native_bf16):
    """As for shorter prompts: a stop between prefill chunks ends the reading, the chat turn is undone, the API
    request ends cancelled, and the engine serves the next one."""
    from macapp.core.serving.requests import ChatMessage, CompletionRequest, FinishReason, Role
    from macapp.core.serving.runner import ServingEngine, ServingOptions

    engine = Engine()
    try:
        engine.load(str(short_native_bf16), context=CONTEXT).result(timeout=TIMEOUT)
        options = SessionOptions(context_limit=CONTEXT, prefill_step_size=64)
        prompt = "the answer is here and there " * 80  # ~650 tokens, past the native 256

        def stop_after_first_chunk(job):
            job.add_listener(lambda e: job.stop() if isinstance(e, PromptProgress) and 0 < e.processed < e.total else None)
            return job

        session = engine.new_session(options=options)
        undone = stop_after_first_chunk(session.send(prompt, thinking=False, sampling=greedy(8))).result(timeout=TIMEOUT)
        assert undone.kept is False and session.messages == [] and session.context_tokens == 0
        request = CompletionRequest(messages=(ChatMessage(Role.USER, prompt),), sampling=greedy(8))
        for batching in (True, False):  # the batch's reading and the one-at-a-time path's
            serving = ServingEngine(engine, ServingOptions(session=options, pool_bytes=0, batching=batching))
            done = stop_after_first_chunk(serving.submit(request)).wait(TIMEOUT)
            serving.close()
            assert done.finish_reason is FinishReason.CANCELLED and done.usage.completion_tokens == 0, batching
        assert session.send("Short one.", thinking=False, sampling=greedy(8)).result(timeout=TIMEOUT).text
    finally:
        engine.close()
