"""The prompt checkpoints on disk keep the MTP head's context: after a restart an agent loop goes on from the disk's
checkpoint with the head drafting from the restored context, and answers exactly as with the head off."""

from __future__ import annotations

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.prompt_disk import DiskStore
from macapp.core.serving.requests import ChatMessage, RequestStarted, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.engine.helpers import TIMEOUT
from tests.core.serving.test_runner import ask


def test_a_checkpoint_read_back_from_disk_keeps_the_heads_context(tiny_mtp, tmp_path):
    e = Engine()
    try:
        e.load(str(tiny_mtp("moe", "successor"))).result(timeout=TIMEOUT)
        on = SessionOptions(mtp=MTPMode.ON)
        first = ServingEngine(e, ServingOptions(session=on, disk=DiskStore(tmp_path, 10**9, 0), batching=False))
        off = ServingEngine(e, ServingOptions(session=SessionOptions(mtp=MTPMode.OFF), pool_bytes=1, batching=False))
        history = [ChatMessage(Role.SYSTEM, "You are a helpful agent."), ChatMessage(Role.USER, "What is in the folder?")]
        reply = first.submit(ask(*history, max_tokens=24)).wait(TIMEOUT)
        first.options.disk.flush()
        history += [ChatMessage(Role.ASSISTANT, reply.text or "ok"), ChatMessage(Role.USER, "and then?")]
        after = ServingEngine(e, ServingOptions(session=on, disk=DiskStore(tmp_path, 10**9, 0), batching=False))  # a restart
        job = after.submit(ask(*history, max_tokens=24))
        events = list(job.events(timeout=TIMEOUT))
        fast, plain = events[-1], off.submit(ask(*history, max_tokens=24)).wait(TIMEOUT)
        started = next(ev for ev in events if isinstance(ev, RequestStarted))
        assert started.cached_from == "disk" and fast.usage.cached_tokens > 0
        assert (fast.text, fast.reasoning) == (plain.text, plain.reasoning)
        assert fast.mtp_tokens_per_step is not None and fast.mtp_tokens_per_step > 1  # the head drafted, and got some right
        restored = [p for p in after.pool._entries.values() if p.length == fast.usage.cached_tokens]
        assert restored and restored[0].head_part is not None  # the head's context came back from the file
    finally:
        e.close()
