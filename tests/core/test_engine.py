"""The engine on tiny real Qwen3.5 models through real mlx-lm (see macapp/devtools/tiny_model.py for the greedy script)."""

from __future__ import annotations

import copy
import json
import shutil
import threading
import time

import mlx.core as mx
import pytest
from mlx_lm.generate import stream_generate

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError, SessionOptions
from macapp.core.events import AnswerDelta, Failed, Finished, PromptProgress, ReasoningDelta, Reply, StatsUpdate
from macapp.core.sampling import greedy, make_sampler_and_processors
from macapp.devtools.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING

REASONING = "".join(SCRIPT_REASONING)
ANSWER = "".join(SCRIPT_ANSWER)
TIMEOUT = 60


@pytest.fixture(scope="module")
def engine(tiny_moe_path):
    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


@pytest.fixture(scope="module")
def ids(engine):
    vocab = engine._model.tokenizer.get_vocab()
    return {t: vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "</think>")}


@pytest.fixture(scope="module")
def off_script(ids):
    """Greedy, but <|im_end|> and <|endoftext|> are banned: long, context-dependent text (mlx-lm's logit bias)."""
    return greedy(40, logit_bias={ids["<|im_end|>"]: -1e9, ids["<|endoftext|>"]: -1e9})


def on_worker(engine, fn):
    """Run fn(loaded model) on the engine's worker thread (MLX work stays on one thread)."""
    box = {}

    def work(job):
        box["value"] = fn(engine._model)
        job.emit(Finished(Reply()))

    engine.submit("test", work).result(timeout=TIMEOUT)
    return box["value"]


def fresh_tokens(engine, prompt_ids, params):
    """What raw mlx-lm generates from scratch for this exact token sequence."""

    def run(m):
        sampler, processors = make_sampler_and_processors(params)
        return [
            r.token
            for r in stream_generate(m.model, m.tokenizer, mx.array(prompt_ids), max_tokens=params.max_tokens, sampler=sampler, logits_processors=processors)
        ]

    return on_worker(engine, run)


def cache_error(engine, session, probe=7, skip=0):
    """Max |logit difference| between the session's cache + one probe token and a fresh run over its tokens.

    The cache is deep-copied, so the session is untouched. `skip` drops leading tokens from the fresh run
    (a deliberately wrong reference, to show the check can fail)."""

    def run(m):
        cached = m.model(mx.array([[probe]]), cache=copy.deepcopy(session._cache))[0, -1]
        fresh = m.model(mx.array([session.tokens[skip:] + [probe]]))[0, -1]
        return mx.abs(cached - fresh).max().item()

    return on_worker(engine, run)


EXACT = 1e-4  # float32 noise between chunked and one-shot evaluation is ~1e-6


def template(engine, messages, thinking):
    return list(engine._model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking))


def kv_offsets(session):
    return [c.offset for c in session._cache if hasattr(c, "offset")]


def joined(events, cls):
    return "".join(e.text for e in events if isinstance(e, cls))


# ---------------------------------------------------------------------------------------------- loading


def test_load_reports_time_memory_and_model(engine, tiny_moe_path):
    info = engine.loaded
    assert info.model_type == "qwen3_5_moe" and info.name == tiny_moe_path.name
    assert 0 < info.load_time_s < 30
    assert info.weights_bytes > 1_000_000 and info.memory_bytes > 0
    assert info.bits is None and info.max_context == 262144 and info.has_thinking


def test_quantized_and_hub_layout_models_load_and_follow_the_script(tiny_moe_4bit_path, tiny_hub_layout_path):
    e = Engine()
    try:
        assert e.load(str(tiny_moe_4bit_path)).result(timeout=TIMEOUT).bits == 4
        assert e.new_session().send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT).text == ANSWER
        info = e.load(str(tiny_hub_layout_path)).result(timeout=TIMEOUT)
        assert info.bits is None and info.model_type == "qwen3_5_moe"
        reply = e.new_session().send("hi", thinking=True, sampling=greedy(30)).result(timeout=TIMEOUT)
        assert (reply.reasoning, reply.text) == (REASONING, ANSWER)
    finally:
        e.close()


def _load_failure(engine_, spec):
    job = engine_.load(str(spec))
    last = job.wait(TIMEOUT)
    assert isinstance(last, Failed), last
    return last


def test_bad_model_folders_are_refused_with_a_reason(tmp_path, tiny_moe_path, monkeypatch):
    e = Engine()
    try:
        missing = _load_failure(e, tmp_path / "nowhere")
        assert missing.code == ev.NOT_FOUND and "nowhere" in missing.message

        empty = tmp_path / "empty"
        empty.mkdir()
        assert _load_failure(e, empty).code == ev.NOT_A_MODEL

        llama = tmp_path / "llama"
        shutil.copytree(tiny_moe_path, llama)
        config = json.loads((llama / "config.json").read_text())
        config["model_type"] = "llama"
        config.pop("text_config")
        (llama / "config.json").write_text(json.dumps(config))
        refused = _load_failure(e, llama)
        assert refused.code == ev.NOT_A_MODEL and "llama" in refused.message

        broken = tmp_path / "broken"
        shutil.copytree(tiny_moe_path, broken)
        weights = broken / "model.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
        corrupt = _load_failure(e, broken)
        assert corrupt.code == ev.CORRUPT and "download" in corrupt.message

        garbled = tmp_path / "garbled"
        shutil.copytree(tiny_moe_path, garbled)
        (garbled / "config.json").write_text("{not json")
        assert _load_failure(e, garbled).code == ev.CORRUPT

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        absent = _load_failure(e, "mlx-community/Qwen3.5-0.8B-4bit")
        assert absent.code == ev.NOT_FOUND and "qwen-desk download" in absent.message
        by_name = _load_failure(e, "Qwen3.5-0.8B")  # a catalog name resolves to its 4-bit repo
        assert by_name.code == ev.NOT_FOUND and "mlx-community/Qwen3.5-0.8B-4bit" in by_name.message

        with pytest.raises(EngineError) as err:
            e.load(str(tmp_path / "nowhere")).result(timeout=TIMEOUT)
        assert err.value.code == ev.NOT_FOUND
    finally:
        e.close()


def test_a_refused_folder_keeps_the_loaded_model(tmp_path, tiny_moe_path):
    e = Engine()
    try:
        e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
        _load_failure(e, tmp_path / "nowhere")
        assert e.loaded is not None
        assert e.new_session().send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT).text == ANSWER
    finally:
        e.close()


def test_chat_without_a_model_fails_clearly():
    e = Engine()
    try:
        last = e.new_session().send("hi").wait(TIMEOUT)
        assert isinstance(last, Failed) and last.code == ev.NO_MODEL
    finally:
        e.close()


# ---------------------------------------------------------------------------------------------- turns


def test_thinking_on_streams_reasoning_then_answer(engine):
    job = engine.new_session().send("hello there", thinking=True, sampling=greedy(60))
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert (reply.reasoning, reply.text, reply.finish_reason) == (REASONING, ANSWER, "stop")
    assert joined(events, ReasoningDelta) == REASONING and joined(events, AnswerDelta) == ANSWER
    kinds = [type(e) for e in events if isinstance(e, (ReasoningDelta, AnswerDelta))]
    assert kinds.index(AnswerDelta) > max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    assert "<think>" not in reply.text + reply.reasoning and "</think>" not in reply.text + reply.reasoning
    assert isinstance(events[-1], Finished) and isinstance(events[0], PromptProgress)


def test_thinking_off_has_no_reasoning(engine):
    job = engine.new_session().send("hello there", thinking=False, sampling=greedy(60))
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert (reply.reasoning, reply.text, reply.stats.reasoning_tokens) == ("", ANSWER, 0)
    assert not any(isinstance(e, ReasoningDelta) for e in events)


def test_a_reply_that_never_closes_its_reasoning_then_the_next_turn(engine):
    s = engine.new_session()
    reply = s.send("hello", thinking=True, sampling=greedy(5)).result(timeout=TIMEOUT)
    assert reply.finish_reason == "length" and reply.text == ""
    assert reply.reasoning == "".join(SCRIPT_REASONING[:5]) and reply.stats.reasoning_tokens == 5
    nxt = s.send("go on", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert nxt.text == ANSWER
    text = engine._model.tokenizer.decode(s.tokens)
    assert "".join(SCRIPT_REASONING[:5]) + "\n</think>\n\n<|im_end|>\n<|im_start|>user\ngo on" in text  # closed, then appended


def test_only_the_new_turn_is_prefilled(engine):
    s = engine.new_session(system_prompt="be brief")
    first = s.send("hello there", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    assert first.stats.prompt_tokens == len(template(engine, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}], True))
    for n, (text, thinking) in enumerate([("second question", False), ("a third, longer question about the cache", True)]):
        before = s.context_tokens
        reply = s.send(text, thinking=thinking, sampling=greedy(60)).result(timeout=TIMEOUT)
        new_turn = template(engine, [{"role": "user", "content": text}], thinking)
        assert reply.stats.prompt_tokens == 1 + len(new_turn)  # "\n" after the model's own <|im_end|>, then the turn
        assert s.context_tokens == before + reply.stats.prompt_tokens + reply.stats.generation_tokens
        assert kv_offsets(s) == [s.context_tokens]  # the cache holds exactly the tokens the session accounts for
        assert cache_error(engine, s) < EXACT
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_append_only_gives_the_same_tokens_as_a_fresh_full_prompt(engine, off_script):
    s = engine.new_session(system_prompt="You are terse.")
    for text, thinking in [("first question", True), ("second", False), ("and a third one", True)]:
        reply = s.send(text, thinking=thinking, sampling=off_script).result(timeout=TIMEOUT)
        assert len(reply.token_ids) == 40 and reply.finish_reason == "length"
    prompt = s.tokens[: len(s.tokens) - len(reply.token_ids)]
    assert fresh_tokens(engine, prompt, off_script) == reply.token_ids
    assert cache_error(engine, s) < EXACT  # the cache after three turns is the fresh state, logit for logit
    assert cache_error(engine, s, skip=3) > 100 * EXACT  # and the check is sensitive to the context
    # ... and that prompt is the conversation as the template writes it, plus the earlier replies kept whole
    tail = template(engine, [{"role": "user", "content": "and a third one"}], True)
    assert prompt[-len(tail):] == tail


def test_stop_mid_stream_keeps_the_partial_reply_and_the_next_turn_works(engine, off_script):
    s = engine.new_session()
    job = s.send("tell me everything", thinking=False, sampling=off_script.with_overrides(max_tokens=100_000))
    seen = threading.Event()
    counter = {"n": 0}

    def listener(event):
        if isinstance(event, AnswerDelta):
            counter["n"] += 1
            if counter["n"] == 20:
                seen.set()

    job.add_listener(listener)
    assert seen.wait(TIMEOUT)
    job.stop()
    last = job.wait(5)
    latency = time.perf_counter() - job.stop_requested_at
    assert latency < 2.0  # generous: about one token's time
    reply = last.reply
    assert reply.finish_reason == "stopped" and reply.kept and len(reply.text) > 0
    assert s.messages[-1]["content"] == reply.text and s.messages[-1]["finish_reason"] == "stopped"
    assert kv_offsets(s) == [s.context_tokens] and cache_error(engine, s) < EXACT
    nxt = s.send("and now?", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert nxt.text == ANSWER and nxt.finish_reason == "stop"
    assert "<|im_end|>\n<|im_start|>user\nand now?" in engine._model.tokenizer.decode(s.tokens)


def test_stop_while_reading_rolls_the_turn_back(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=8))
    s.send("hi", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    before_tokens, before_messages = list(s.tokens), s.messages
    job = s.send("word " * 200, thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) and e.processed > 0 else None)
    assert reading.wait(TIMEOUT)
    job.stop()
    reply = job.result(timeout=10)
    assert reply.finish_reason == "stopped" and not reply.kept
    job.join(TIMEOUT)  # the undo happens once the chunk in flight is done
    assert s.tokens == before_tokens and s.messages == before_messages and kv_offsets(s) == [len(before_tokens)]
    assert cache_error(engine, s) < EXACT
    again = s.send("short", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "short"}], False))
    assert again.text == ANSWER


def test_thinking_budget_closes_the_reasoning_and_the_model_answers(engine):
    s = engine.new_session()
    job = s.send("hello", thinking=True, sampling=greedy(60), thinking_budget=3)
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert reply.budget_hit and reply.stats.reasoning_tokens == 3 and reply.stats.forced_tokens == 3
    assert reply.reasoning == "".join(SCRIPT_REASONING[:3]) and reply.text == ANSWER and reply.finish_reason == "stop"
    assert joined(events, ReasoningDelta) == reply.reasoning
    assert "".join(SCRIPT_REASONING[:3]) + "\n</think>\n\n" + ANSWER in engine._model.tokenizer.decode(s.tokens)
    assert cache_error(engine, s) < EXACT
    zero = s.send("again", thinking=True, sampling=greedy(60), thinking_budget=0).result(timeout=TIMEOUT)
    assert (zero.reasoning, zero.text, zero.stats.reasoning_tokens) == ("", ANSWER, 0)
    roomy = s.send("more", thinking=True, sampling=greedy(60), thinking_budget=100).result(timeout=TIMEOUT)
    assert (roomy.reasoning, roomy.text, roomy.budget_hit) == (REASONING, ANSWER, False)


def test_stats_fields_are_sane_and_agree_with_a_stopwatch(engine, off_script):
    s = engine.new_session()
    t0 = time.perf_counter()
    job = s.send("count", thinking=True, sampling=off_script.with_overrides(max_tokens=60))
    events = list(job.events(timeout=TIMEOUT))
    wall = time.perf_counter() - t0
    st = job.result().stats
    assert st.finish_reason == "length" and st.generation_tokens == 60 == len(job.result().token_ids)
    assert 0 < st.ttft_s <= st.elapsed_s <= wall
    assert st.prompt_tokens == len(template(engine, [{"role": "user", "content": "count"}], True))
    assert st.prompt_tps > 0 and st.generation_tps > 0
    decode_time = (st.generation_tokens - 1) / st.generation_tps
    assert decode_time <= st.elapsed_s - st.ttft_s + 0.05  # measured from the first token, TTFT excluded
    assert 0 < st.reasoning_tokens <= st.generation_tokens
    assert st.peak_memory_bytes > engine.loaded.weights_bytes
    assert st.context_tokens == s.context_tokens
    live = [e.stats for e in events if isinstance(e, StatsUpdate)]
    assert live and all(u.generation_tokens <= st.generation_tokens for u in live)
    assert live[0].finish_reason is None


def test_progress_events_while_a_long_prompt_is_read(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=16))
    job = s.send("word " * 100, thinking=False, sampling=greedy(10))
    progress = [e for e in job.events(timeout=TIMEOUT) if isinstance(e, PromptProgress)]
    total = job.result().stats.prompt_tokens
    assert total > 100
    assert progress[0].processed == 0 and progress[-1].processed == total
    assert all(p.total == total for p in progress)
    assert [p.processed for p in progress] == sorted(p.processed for p in progress)
    assert len(progress) >= total // 16


# ---------------------------------------------------------------------------------------------- bad input


def test_empty_prompt_is_refused_before_any_work(engine):
    s = engine.new_session()
    s.send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("   \n", thinking=False)
    events = list(job.events(timeout=TIMEOUT))
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].code == ev.EMPTY_PROMPT
    assert s.tokens == before and len(s.messages) == 2


def test_a_prompt_over_the_context_limit_is_refused_before_any_work(engine):
    s = engine.new_session(options=SessionOptions(context_limit=64))
    s.send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("word " * 80, thinking=False)
    events = list(job.events(timeout=TIMEOUT))
    assert len(events) == 1 and events[0].code == ev.CONTEXT_LIMIT
    assert "context" in events[0].message and "64" in events[0].message
    assert s.tokens == before
    ok = s.send("ok", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    assert ok.text == ANSWER


def test_a_reply_stops_at_the_context_limit(engine, off_script):
    s = engine.new_session(options=SessionOptions(context_limit=40))
    reply = s.send("hi", thinking=False, sampling=off_script.with_overrides(max_tokens=1000)).result(timeout=TIMEOUT)
    assert reply.finish_reason == "context" and s.context_tokens == 40


def test_a_prompt_over_the_memory_budget_is_refused(engine):
    s = engine.new_session(options=SessionOptions(memory_budget_bytes=10_000_000))
    last = s.send("hi", thinking=False).wait(TIMEOUT)
    assert isinstance(last, Failed) and last.code == ev.MEMORY_BUDGET and "GB" in last.message
    assert s.context_tokens == 0


# ---------------------------------------------------------------------------------------------- regenerate / edit


def test_regenerate_prefills_one_token_and_restores_the_exact_cache(engine, off_script):
    s = engine.new_session()
    s.send("first", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    original = s.send("second", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    length = s.context_tokens
    again = s.regenerate(sampling=off_script).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1
    assert again.token_ids == original.token_ids  # same state, same greedy tokens
    assert s.context_tokens == length and kv_offsets(s) == [length]
    assert cache_error(engine, s) < EXACT
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    assert s.snapshot_bytes > 0
    other = s.regenerate(thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)  # another mode: the user turn again
    assert other.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "second"}], True))
    assert (other.reasoning, other.text) == (REASONING, ANSWER)
    assert s.messages[-1]["thinking"] is True and cache_error(engine, s) < EXACT


def test_edit_last_prefills_only_the_new_message_and_matches_a_fresh_session(engine, off_script):
    s = engine.new_session(system_prompt="sys")
    s.send("first", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    s.send("a question with a typo", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    edited = s.edit_last("a question, fixed", sampling=off_script).result(timeout=TIMEOUT)
    assert edited.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "a question, fixed"}], False))
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["first", "a question, fixed"]
    fresh = engine.new_session(system_prompt="sys")
    fresh.send("first", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    reference = fresh.send("a question, fixed", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    assert edited.token_ids == reference.token_ids and s.tokens == fresh.tokens
    assert cache_error(engine, s) < EXACT


def test_regenerate_with_nothing_to_redo_fails_clearly(engine):
    last = engine.new_session().regenerate().wait(TIMEOUT)
    assert isinstance(last, Failed) and last.code == ev.NOTHING_TO_REDO


# ---------------------------------------------------------------------------------------------- reopened / options


def test_a_reopened_conversation_is_read_once_then_appended(engine):
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer", "reasoning": "old thoughts"},
    ]
    s = engine.new_session(messages=history)
    first = s.send("new question", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    expected = template(engine, history[:1] + [history[1], {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "new question"}], True)
    assert first.stats.prompt_tokens == len(expected) and s.tokens[: len(expected)] == expected
    assert "old thoughts" not in engine._model.tokenizer.decode(s.tokens)  # the template drops old reasoning
    second = s.send("next", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert second.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "next"}], False))
    assert cache_error(engine, s) < EXACT


def test_regenerate_on_a_reopened_conversation_reads_it_once(engine):
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    s = engine.new_session(messages=history)
    reply = s.regenerate(thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert reply.stats.prompt_tokens == len(template(engine, [history[0]], False)) and reply.text == ANSWER
    assert [m["role"] for m in s.messages] == ["user", "assistant"]


def test_quantized_kv_cache_works_across_turns_and_regenerate(engine):
    s = engine.new_session(options=SessionOptions(kv_bits=8))
    s.send("hello", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    reply = s.send("again", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert type(s._cache[-1]).__name__ == "QuantizedKVCache"
    again = s.regenerate(sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 and again.token_ids == reply.token_ids
    assert kv_offsets(s) == [s.context_tokens]


def test_a_session_follows_a_newly_loaded_model_by_reading_the_conversation_once(tiny_moe_path, tiny_dense_path):
    e = Engine()
    try:
        e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
        s = e.new_session()
        s.send("hello", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
        e.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
        assert s._cache is None and s.context_tokens == 0  # the old model's cache is freed with it
        reply = s.send("again", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
        expected = template(e, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "again"}], False)
        assert reply.stats.prompt_tokens == len(expected) and reply.text == ANSWER
    finally:
        e.close()


def test_listeners_run_on_the_worker_and_late_listeners_get_a_replay(engine):
    threads = set()
    job = engine.new_session().send("hi", thinking=False, sampling=greedy(30))
    job.add_listener(lambda e: threads.add(threading.current_thread().name))
    job.wait(TIMEOUT)
    late = []
    job.add_listener(late.append)
    assert "qwen-desk-engine" in threads
    assert late == job.history and isinstance(late[-1], Finished)


def test_listeners_added_while_streaming_get_every_event_once_in_order(engine, off_script):
    job = engine.new_session().send("go", thinking=False, sampling=off_script.with_overrides(max_tokens=200))
    started = threading.Event()
    job.add_listener(lambda e: started.set() if isinstance(e, AnswerDelta) else None)
    assert started.wait(TIMEOUT)
    me = threading.current_thread()

    def slow_here(got):  # the replay on this thread is slow, so the worker emits new events meanwhile
        return lambda e: (time.sleep(0.002) if threading.current_thread() is me else None, got.append(e))

    received, while_running = [], 0
    for _ in range(6):
        received.append([])
        while_running += not job.done
        job.add_listener(slow_here(received[-1]))
    job.join(TIMEOUT)
    full = job.history
    assert while_running >= 2
    for got in received:
        assert got == full and sum(isinstance(e, Finished) for e in got) == 1


def test_close_stops_a_running_reply(tiny_moe_path, off_script):
    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
    job = e.new_session().send("go", thinking=False, sampling=off_script.with_overrides(max_tokens=100_000))
    started = threading.Event()
    job.add_listener(lambda event: started.set() if isinstance(event, AnswerDelta) else None)
    assert started.wait(TIMEOUT)
    e.close()
    assert job.result(timeout=10).finish_reason == "stopped" and e.loaded is None
    with pytest.raises(RuntimeError, match="closed"):
        e.new_session().send("again")


def test_a_downloaded_repo_id_loads_from_the_hugging_face_cache(tiny_moe_path, monkeypatch, tmp_path):
    hub = tmp_path / "hf" / "hub"
    snapshot = hub / "models--acme--tiny-qwen" / "snapshots" / "0123abc"
    shutil.copytree(tiny_moe_path, snapshot)
    (hub / "models--acme--tiny-qwen" / "refs").mkdir()
    (hub / "models--acme--tiny-qwen" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    e = Engine()
    try:
        info = e.load("acme/tiny-qwen").result(timeout=TIMEOUT)
        assert info.name == "acme/tiny-qwen" and info.path == str(snapshot)
    finally:
        e.close()


def test_stopping_a_regenerate_that_rereads_the_conversation_keeps_the_message(engine):
    history = [{"role": "user", "content": "word " * 150}, {"role": "assistant", "content": "old"}]
    s = engine.new_session(messages=history, options=SessionOptions(prefill_step_size=8))
    job = s.regenerate(thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) and e.processed > 0 else None)
    assert reading.wait(TIMEOUT)
    job.stop()
    assert not job.result(timeout=10).kept
    job.join(TIMEOUT)
    assert [m["role"] for m in s.messages] == ["user"] and s.context_tokens == 0
    again = s.regenerate(thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.text == ANSWER and again.stats.prompt_tokens == len(template(engine, history[:1], False))
    assert cache_error(engine, s) < EXACT


def test_a_regenerate_from_a_snapshot_is_never_rolled_back(engine, off_script):
    s = engine.new_session(options=SessionOptions(prefill_step_size=4))
    s.send("word " * 40, thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    job = s.regenerate(thinking=True, sampling=off_script.with_overrides(max_tokens=100_000))  # re-reads the user turn
    job.stop()  # before or while it reads: it reads on, then stops at its first token
    reply = job.result(timeout=TIMEOUT)
    job.join(TIMEOUT)
    if reply.kept:  # stopped after reading: the turn is whole
        assert reply.finish_reason == "stopped" and reply.stats.generation_tokens >= 1
        assert [m["role"] for m in s.messages] == ["user", "assistant"] and cache_error(engine, s) < EXACT
    else:  # stopped before the job began: nothing changed
        assert [m["role"] for m in s.messages] == ["user", "assistant"] and s.messages[-1]["thinking"] is False


def test_stop_during_a_long_chunk_answers_at_once_and_undoes_the_turn(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=100_000))  # the whole prompt in one chunk
    s.send("hi", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("word " * 2500, thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) else None)
    assert reading.wait(TIMEOUT)
    time.sleep(0.05)
    job.stop()
    last = job.wait(1.0)  # the chunk itself takes seconds here
    assert time.perf_counter() - job.stop_requested_at < 1.0
    assert isinstance(last, Finished) and not last.reply.kept and last.reply.finish_reason == "stopped"
    nxt = s.send("short", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)  # runs after the undo
    assert nxt.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "short"}], False))
    assert s.tokens[: len(before)] == before and cache_error(engine, s) < EXACT
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["hi", "short"]
    assert sum(isinstance(e, Finished) for e in job.history) == 1


def test_load_finds_and_checks_the_folder_once_with_the_catalog_rules(tiny_moe_path, monkeypatch):
    from macapp.core import catalog, engine as engine_mod, sizing

    assert engine_mod.SUPPORTED_MODEL_TYPES is catalog.SUPPORTED_MODEL_TYPES and engine_mod.REPO_ID is catalog.REPO_ID
    assert SessionOptions().prefill_step_size == sizing.DEFAULT_PREFILL_STEP
    calls = []
    for name in ("locate_model", "check_model_folder"):
        real = getattr(engine_mod, name)
        monkeypatch.setattr(engine_mod, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    e = Engine()
    try:
        assert e.load(str(tiny_moe_path)).result(timeout=TIMEOUT).name
    finally:
        e.close()
    assert sorted(calls) == ["check_model_folder", "locate_model"]
