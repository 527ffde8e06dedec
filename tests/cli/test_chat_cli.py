"""`qwen-desk chat` on the tiny model: scripted turns with --json, history, errors, the interactive loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from macapp.cli import main
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING

REASONING = "".join(SCRIPT_REASONING)
ANSWER = "".join(SCRIPT_ANSWER)
CONTRACT = {
    "turn",
    "text",
    "reasoning",
    "prompt_tokens",
    "generation_tokens",
    "ttft_s",
    "prompt_tps",
    "generation_tps",
    "peak_memory_bytes",
    "finish_reason",
}


def run_json(capsys, *argv):
    code = main(["chat", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_prompts_are_turns_of_one_conversation_with_json_records(capsys, tiny_moe_path):
    turns = run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "hi", "--prompt", "again", "--temp", "0", "--no-history")
    assert [t["turn"] for t in turns] == [1, 2]
    for t in turns:
        assert CONTRACT <= set(t)
        assert (t["reasoning"], t["text"], t["finish_reason"]) == (REASONING, ANSWER, "stop")
        assert t["generation_tokens"] == 18 and t["ttft_s"] > 0 and t["generation_tps"] > 0 and t["peak_memory_bytes"] > 0
    # turn 2 prefills only its own turn: "\n" + "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert turns[1]["prompt_tokens"] < turns[0]["prompt_tokens"] + 5
    assert turns[1]["context_tokens"] == turns[0]["context_tokens"] + turns[1]["prompt_tokens"] + turns[1]["generation_tokens"]


def test_no_think_and_thinking_budget(capsys, tiny_moe_path):
    (plain,) = run_json(capsys, "--model", str(tiny_moe_path), "--no-think", "--prompt", "hi", "--temp", "0", "--no-history")
    assert (plain["reasoning"], plain["text"], plain["thinking"]) == ("", ANSWER, False)
    (short,) = run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "hi", "--temp", "0", "--thinking-budget", "2", "--no-history")
    assert short["reasoning"] == "".join(SCRIPT_REASONING[:2]) and short["text"] == ANSWER and short["budget_hit"]
    (cut,) = run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "hi", "--temp", "0", "--max-tokens", "4", "--no-history")
    assert cut["finish_reason"] == "length" and cut["text"] == "" and cut["generation_tokens"] == 4


def test_conversations_are_saved_to_the_history_and_can_be_resumed(capsys, tiny_moe_path):
    from macapp.core.history import Store

    turns = run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "first question", "--prompt", "second", "--temp", "0")
    conv_id = turns[0]["conversation_id"]
    with Store.open() as store:
        conv = store.get_conversation(conv_id)
        assert [(m.role, m.content) for m in conv.messages] == [("user", "first question"), ("assistant", ANSWER), ("user", "second"), ("assistant", ANSWER)]
        assert conv.messages[1].reasoning == REASONING and conv.messages[1].stats.generation_tokens == 18
    (resumed,) = run_json(capsys, "--model", str(tiny_moe_path), "--resume", str(conv_id), "--prompt", "third", "--temp", "0", "--prompt-cache-disk", "0")
    assert resumed["conversation_id"] == conv_id
    assert resumed["prompt_tokens"] > turns[0]["prompt_tokens"] + turns[1]["prompt_tokens"]  # the history is read once
    with Store.open() as store:
        assert len(store.get_conversation(conv_id).messages) == 6
    run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "unsaved", "--temp", "0", "--no-history")
    with Store.open() as store:
        assert len(store.list_conversations()) == 1


def test_a_resumed_conversation_reads_only_what_is_new_from_disk(capsys, tiny_moe_path):
    """Two equal conversations, each continued twice in new processes. From the disk's checkpoints (the default)
    each continuation reads only its new message: the conversation is read again as its session held it (each
    reply in the tokens the history saved), so the checkpoint the last process left after its reply matches whole.
    With --prompt-cache-disk 0 all of it is read each time; the replies and the caches are the same."""
    model = ("--model", str(tiny_moe_path), "--temp", "0")
    runs = {}
    for size in ("0", "20GB"):
        first = run_json(capsys, *model, "--prompt", "first question", "--prompt", "second", "--prompt-cache-disk", size)
        conv = first[0]["conversation_id"]
        runs[size] = [run_json(capsys, *model, "--resume", str(conv), "--prompt", words, "--prompt-cache-disk", size)[0] for words in ("third", "fourth")]
    cold, warm = runs["0"], runs["20GB"]
    assert [(r["text"], r["reasoning"]) for r in warm] == [(r["text"], r["reasoning"]) for r in cold] == [(ANSWER, REASONING)] * 2
    assert [r["context_tokens"] for r in warm] == [r["context_tokens"] for r in cold]
    # each continuation's context: the process before's, then its own new message and reply, as one process would
    assert cold[0]["context_tokens"] == first[1]["context_tokens"] + warm[0]["prompt_tokens"] + warm[0]["generation_tokens"]
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(tiny_moe_path)
    for words, reply in zip(("third", "fourth"), warm):
        turn = tokenizer.apply_chat_template([{"role": "user", "content": words}], add_generation_prompt=True, tokenize=True)
        assert reply["prompt_tokens"] == 1 + len(turn)  # "\n" after the last reply's <|im_end|>, then the new message


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "{tmp}/nowhere", "--prompt", "hi"], "No model folder"),
        (["--model", "{model}", "--prompt", "  "], "empty"),
        (["--model", "{model}", "--json"], "--json needs"),
        (["--model", "{model}", "--prompt", "word " * 100, "--context", "64", "--no-history"], "context"),
        (["--model", "{model}", "--prompt", "hi", "--temp", "-1"], "temperature"),
        (["--model", "{model}", "--prompt", "hi", "--no-think", "--preset", "precise"], "precise"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, tmp_path, tiny_moe_path, argv, needle):
    argv = [a.format(tmp=tmp_path, model=tiny_moe_path) for a in argv]
    code = main(["chat", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and needle in err and out == ""


def _cli(*argv, stdin=None, home):
    env = dict(os.environ, QWEN_DESK_HOME=str(home), MLX_DISABLE_COMPILE="1")
    return subprocess.run([sys.executable, "-m", "macapp", "chat", *argv], input=stdin, capture_output=True, text=True, timeout=120, env=env)


def test_the_command_works_in_a_fresh_process(tiny_moe_path, tmp_path):
    proc = _cli("--model", str(tiny_moe_path), "--prompt", "hi", "--prompt", "again", "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["turn"] for line in lines] == [1, 2] and all(CONTRACT <= set(line) for line in lines)


def test_interactive_chat_streams_replies_and_prints_stats(tiny_moe_path, tmp_path):
    script = "hello\n/nothink\nsecond\n/regen\n/edit changed\n/quit\n"
    proc = _cli("--model", str(tiny_moe_path), "--temp", "0", stdin=script, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(ANSWER) == 4 and proc.stdout.count(REASONING) == 1
    stats = [line for line in proc.stderr.splitlines() if line.startswith("prompt ")]
    assert len(stats) == 4 and "prompt 1 tokens" in stats[2]  # /regen re-reads one token
    assert all("tok/s" in line and "first token" in line and "peak" in line for line in stats)
    from macapp.core.history import Store

    os.environ["QWEN_DESK_HOME"] = str(tmp_path)  # the autouse fixture restores it after the test
    with Store.open() as store:
        (conv,) = store.list_conversations()
        users = [m.content for m in store.get_conversation(conv.id).messages if m.role == "user"]
    assert users == ["hello", "changed"]


def _endless_copy(model_path, dest):
    """The tiny model with its end-of-turn tokens' lm_head rows zeroed: greedy decoding never ends a reply."""
    import shutil

    import mlx.core as mx

    shutil.copytree(model_path, dest)
    vocab = json.loads((dest / "tokenizer.json").read_text())["model"]["vocab"]
    weights = mx.load(str(dest / "model.safetensors"))
    head = weights["language_model.lm_head.weight"]
    for token in ("<|im_end|>", "<|endoftext|>"):
        head[vocab[token]] = 0.0  # logit 0, below the best of the other 510 random logits
    weights["language_model.lm_head.weight"] = head
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    return dest


def test_a_kill_mid_reply_keeps_the_user_message_and_the_reply_so_far(tiny_moe_path, tmp_path):
    import signal
    import sqlite3
    import time

    model = _endless_copy(tiny_moe_path, tmp_path / "endless")
    home = tmp_path / "home"
    env = dict(os.environ, QWEN_DESK_HOME=str(home), MLX_DISABLE_COMPILE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "chat", "--model", str(model), "--prompt", "tell me everything", "--temp", "0", "--max-tokens", "1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdout.read(1)  # the reply has begun streaming
        db = home / "history.sqlite3"
        deadline, partial = time.monotonic() + 30, None
        while partial is None and time.monotonic() < deadline:  # the reply so far is committed within ~1 s
            time.sleep(0.1)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                partial = conn.execute("SELECT 1 FROM messages WHERE role = 'assistant' AND length(content) + length(reasoning) > 0").fetchone()
        assert proc.poll() is None, "the reply ended on its own: the test needs an endless one"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    from macapp.core.history import Store

    os.environ["QWEN_DESK_HOME"] = str(home)  # the autouse fixture restores it after the test
    with Store.open() as store:
        (conv,) = store.list_conversations()
        user, reply = store.get_conversation(conv.id).messages
    assert (user.role, user.content) == ("user", "tell me everything")
    assert reply.role == "assistant" and reply.state in ("streaming", "stopped") and (reply.content or reply.reasoning)
    with sqlite3.connect(home / "history.sqlite3") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_refused_first_message_leaves_no_conversation_behind(capsys, tiny_moe_path):
    from macapp.core.history import Store

    code = main(["chat", "--model", str(tiny_moe_path), "--prompt", "word " * 100, "--context", "64"])
    assert code == 2 and "context" in capsys.readouterr().err
    with Store.open() as store:
        assert store.list_conversations() == []


def test_a_refused_edit_keeps_the_turn_it_would_have_replaced(tiny_moe_path, tmp_path):
    script = "hello\n/edit " + "word " * 100 + "\n/quit\n"
    proc = _cli("--model", str(tiny_moe_path), "--temp", "0", "--context", "80", stdin=script, home=tmp_path)
    assert proc.returncode == 0 and "context" in proc.stderr, proc.stderr
    from macapp.core.history import Store

    os.environ["QWEN_DESK_HOME"] = str(tmp_path)  # the autouse fixture restores it after the test
    with Store.open() as store:
        (conv,) = store.list_conversations()
        messages = store.get_conversation(conv.id).messages
    assert [(m.role, m.content) for m in messages] == [("user", "hello"), ("assistant", ANSWER)]


def test_context_takes_k_like_fit(capsys, tiny_moe_path):
    code = main(["chat", "--model", str(tiny_moe_path), "--prompt", "word " * 1100, "--context", "1k", "--no-history"])
    out, err = capsys.readouterr()
    assert code == 2 and "1,024-token context" in err
