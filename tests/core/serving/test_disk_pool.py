"""Prompt checkpoints on disk (macapp.core.prompt_disk) under the API's pool, on the real tiny Qwen3.5 models: a
conversation read back after a restart goes on exactly as a fresh read does; garbled files, other weights, a full
disk, the size bound and two processes at once never give a wrong token or an error."""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import replace

import pytest

from macapp.core.engine import SessionOptions
from macapp.core.prompt_disk import DiskStore, parse_size
from macapp.core.serving.render import render
from macapp.core.serving.requests import ChatMessage, Completed, RequestStarted, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from macapp.core.demo.tiny_model import make_tiny_model
from tests.core.serving.test_runner import SYSTEM, USER, ask, off_script, run

LOG = "macapp.prompt_disk"


def store(root, max_bytes: int = 10**9, floor_bytes: int = 0) -> DiskStore:
    return DiskStore(root, max_bytes, floor_bytes)


def served(engine, root, *, disk: DiskStore | None = None, **options) -> ServingEngine:
    """A server on `engine` whose checkpoints also go to the store at `root` (a new store: a restarted server)."""
    return ServingEngine(engine, ServingOptions(disk=disk or store(root), **options))


def answer(serving: ServingEngine, messages, sampling) -> tuple[Completed, RequestStarted]:
    events, done = run(serving, ask(*messages, sampling=sampling))
    assert isinstance(done, Completed), done
    if serving.options.disk is not None:
        serving.options.disk.flush()
    return done, next(e for e in events if isinstance(e, RequestStarted))


def conversation(engine, sampling, reference: ServingEngine, turns: int = 2) -> list[list[ChatMessage]]:
    """The message lists of a conversation of `turns` requests, each answered by `reference`."""
    messages, out = [SYSTEM, USER], []
    for i in range(turns):
        out.append(list(messages))
        done, _ = answer(reference, messages, sampling)
        messages += [ChatMessage(Role.ASSISTANT, done.text[:40]), ChatMessage(Role.USER, f"Go on ({i}).")]
    out.append(list(messages))
    return out


@pytest.mark.parametrize("kind", ["moe", "dense", "moe-kv8"])
def test_a_conversation_read_back_from_disk_after_a_restart_goes_on_exactly_as_a_fresh_read(load, tiny_moe_path, tiny_dense_path, tmp_path, kind):
    engine = load(tiny_dense_path if kind == "dense" else tiny_moe_path)
    session = SessionOptions(kv_bits=8) if kind.endswith("kv8") else SessionOptions()
    sampling = off_script(engine)
    fresh = ServingEngine(engine, ServingOptions(session=session, pool_bytes=1))  # nothing kept: every prompt read whole
    first, second, third = conversation(engine, sampling, fresh)
    before = served(engine, tmp_path, session=session)
    answer(before, first, sampling)
    answer(before, second, sampling)
    assert before.options.disk.written > 0 and before.options.disk.nbytes > 0
    after = served(engine, tmp_path, session=session)  # a restart: a new store on the folder, nothing in memory
    done, started = answer(after, third, sampling)
    expected, _ = answer(fresh, third, sampling)
    assert started.cached_from == "disk" and done.usage.cached_tokens > 0
    prompt = render(engine.model.tokenizer, ask(*third))
    assert done.usage.cached_tokens == max(
        b for b in prompt.boundaries if b < len(prompt.tokens) - 1 and prompt.tokens[:b] == render(engine.model.tokenizer, ask(*second)).tokens[:b]
    )
    assert done.text == expected.text and len(done.text) > 20
    again, started = answer(after, third, sampling)  # the same request again: from memory now, the prompt but its last token
    assert started.cached_from == "memory" and again.usage.cached_tokens == done.usage.prompt_tokens - 1 and again.text == expected.text
    resent = served(engine, tmp_path, session=session)
    done, started = answer(resent, third, sampling)  # after another restart: the whole prompt but its last token, from disk
    assert started.cached_from == "disk" and done.usage.cached_tokens == done.usage.prompt_tokens - 1 and done.text == expected.text


def test_one_conversation_keeps_one_copy_of_its_kv_on_disk(load, tiny_moe_path, tmp_path):
    """Each file holds the KV of the tokens after the checkpoint it continues: the files of a conversation hold
    each token's KV once (plus one DeltaNet state per checkpoint)."""
    engine = load(tiny_moe_path)
    sampling = off_script(engine)
    serving = served(engine, tmp_path)
    first, second, third = conversation(engine, sampling, ServingEngine(engine, ServingOptions(pool_bytes=1)))
    for messages in (first, second, third):
        answer(serving, messages, sampling)
    from macapp.core.modelfiles import read_safetensors_header

    headers = [read_safetensors_header(p).metadata for p in tmp_path.glob("*/*.safetensors")]
    assert len(headers) == serving.options.disk.written >= 4
    by_digest = {h["digest"]: h for h in headers}
    for h in headers:  # a tree: each file goes on from the end of the file it continues
        assert h["parent"] == "" and h["parent_length"] == "0" or by_digest[h["parent"]]["length"] == h["parent_length"]
    stored = sum(int(h["length"]) - int(h["parent_length"]) for h in headers)
    assert stored * 2 < sum(int(h["length"]) for h in headers)  # far less than each checkpoint's KV in full
    assert sum(h["parent"] == "" for h in headers) == 1  # one chain from the start: the system prompt and tools


@pytest.mark.parametrize("damage", ["garbled", "truncated", "emptied"])
def test_a_damaged_file_is_logged_removed_and_the_prompt_read_afresh(load, tiny_moe_path, tmp_path, caplog, damage):
    engine = load(tiny_moe_path)
    sampling = off_script(engine)
    fresh = ServingEngine(engine, ServingOptions(pool_bytes=1))
    first, second = conversation(engine, sampling, fresh, turns=1)
    answer(served(engine, tmp_path), first, sampling)
    files = sorted(tmp_path.glob("*/*.safetensors"))
    assert files
    damaged = {}
    for path in files:
        data = bytearray(path.read_bytes())
        if damage == "garbled":  # a byte flipped in every array's data, past the header
            for at in range(len(data) - 1, len(data) // 2, -97):
                data[at] ^= 0x55
        elif damage == "truncated":
            data = data[: len(data) * 2 // 3]
        else:
            data = bytearray()
        path.write_bytes(bytes(data))
        damaged[path] = bytes(data)
    with caplog.at_level(logging.WARNING, logger=LOG):
        done, started = answer(served(engine, tmp_path), second, sampling)
    expected, _ = answer(fresh, second, sampling)
    assert done.text == expected.text and done.usage.cached_tokens == 0 and started.cached_from == ""
    assert "unusable" in caplog.text and not any(p.exists() and p.read_bytes() == damaged[p] for p in files)  # gone (some written anew)


def test_other_weights_in_the_same_folder_reuse_nothing_and_answer_as_themselves(load, tmp_path):
    folder = make_tiny_model(tmp_path / "model", "moe", seed=1)
    engine = load(folder)
    sampling = off_script(engine)
    first, _ = conversation(engine, sampling, ServingEngine(engine, ServingOptions(pool_bytes=1)), turns=1)
    answer(served(engine, tmp_path / "cache"), first, sampling)
    assert list((tmp_path / "cache").glob("*/*.safetensors"))
    engine.unload().result(timeout=120)
    make_tiny_model(folder, "moe", seed=2)  # other weights, the same folder and tokenizer
    engine = load(folder)
    done, started = answer(served(engine, tmp_path / "cache"), first, sampling)
    expected, _ = answer(ServingEngine(engine, ServingOptions(pool_bytes=1)), first, sampling)
    assert done.usage.cached_tokens == 0 and started.cached_from == "" and done.text == expected.text
    assert len({p.parent for p in (tmp_path / "cache").glob("*/*.safetensors")}) == 2  # a folder per fingerprint


def test_a_full_disk_turns_writing_off_with_a_log_line_and_nothing_else(load, tiny_moe_path, tmp_path, caplog):
    engine = load(tiny_moe_path)
    sampling = off_script(engine)
    free = shutil.disk_usage(tmp_path).free
    full = store(tmp_path, floor_bytes=free + 10**12)  # the floor above the free space: as a full disk looks
    serving = served(engine, tmp_path, disk=full)
    first, second = conversation(engine, sampling, ServingEngine(engine, ServingOptions(pool_bytes=1)), turns=1)
    with caplog.at_level(logging.WARNING, logger=LOG):
        answer(serving, first, sampling)
        done, started = answer(serving, second, sampling)
    assert not full.writing and full.written == 0 and not list(tmp_path.glob("*/*.safetensors"))
    assert [r.message for r in caplog.records if r.name == LOG and "turned off" in r.message] and len(caplog.records) == 1
    assert started.cached_from == "memory" and done.usage.cached_tokens > 0  # memory goes on as before


def test_the_size_bound_holds_least_recently_used_first(load, tiny_moe_path, tmp_path):
    engine = load(tiny_moe_path)
    sampling = replace(off_script(engine), max_tokens=4)
    bound = parse_size("8MB")
    disk = store(tmp_path, max_bytes=bound)
    serving = served(engine, tmp_path, disk=disk)
    for i in range(12):  # other conversations, each some hundreds of tokens (a few hundred KB a file on the tiny model)
        answer(serving, [ChatMessage(Role.SYSTEM, f"Agent {i}. " + "You read files and answer. " * (40 + 7 * i)), USER], sampling)
        total = sum(p.stat().st_size for p in tmp_path.glob("*/*.safetensors"))
        assert total <= bound and total == disk.nbytes
    assert disk.written > len(list(tmp_path.glob("*/*.safetensors")))  # some were evicted
    newest = [ChatMessage(Role.SYSTEM, "Agent 11. " + "You read files and answer. " * (40 + 77)), USER]
    _, started = answer(served(engine, tmp_path, disk=store(tmp_path, max_bytes=bound)), newest, sampling)
    assert started.cached_from == "disk"  # the last conversation is still there


def test_two_processes_write_and_read_the_same_folder_at_once(load, tiny_moe_path, tmp_path):
    """Two stores on one folder (the server and the window): both write the same conversation's checkpoints at
    once, each reads what the other wrote, and no temporary file or half-written file is left."""
    engine = load(tiny_moe_path)
    sampling = off_script(engine)
    fresh = ServingEngine(engine, ServingOptions(pool_bytes=1))
    first, second = conversation(engine, sampling, fresh, turns=1)
    a, b = store(tmp_path), store(tmp_path)
    serving_a, serving_b = served(engine, tmp_path, disk=a), served(engine, tmp_path, disk=b)
    done = threading.Event()
    scans: list[int] = []

    def watch() -> None:  # a third reader listing the store while both write
        while not done.is_set():
            scans.append(sum(s.files for s in DiskStore(tmp_path, 10**9, 0).summary()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        jobs = [serving_a.submit(ask(*first, sampling=sampling)), serving_b.submit(ask(*first, sampling=sampling))]
        results = [list(j.events(timeout=120))[-1] for j in jobs]
        a.flush()
        b.flush()
    finally:
        done.set()
        watcher.join()
    assert all(isinstance(r, Completed) for r in results) and results[0].text == results[1].text
    assert not list(tmp_path.glob("*/.*")) and scans
    reader = served(engine, tmp_path, disk=store(tmp_path))
    got, started = answer(reader, second, sampling)
    assert started.cached_from == "disk" and got.text == answer(fresh, second, sampling)[0].text
