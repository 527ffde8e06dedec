"""Prompt checkpoints with pictures on disk: after a restart a follow-up about the same picture is read on from the
disk's checkpoint (its mRoPE spans with it), the tower does not run again, and the reply is a fresh read's."""

from __future__ import annotations

from macapp.core.prompt_disk import DiskStore
from macapp.core.serving.requests import ChatMessage, RequestStarted, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.engine.helpers import TIMEOUT
from tests.core.vision.test_serving_reuse import SYSTEM, _ask, _encoded, _image, _run, _user


def test_a_follow_up_about_a_picture_after_a_restart_reads_on_from_disk(engine, long_reply, tmp_path):
    before = ServingEngine(engine, ServingOptions(disk=DiskStore(tmp_path, 10**9, 0)))
    first_turn = [SYSTEM, _user("describe it", _image(3))]
    first = _run(before, _ask(first_turn, long_reply))
    before.options.disk.flush()
    follow_up = [*first_turn, ChatMessage(Role.ASSISTANT, first.text), _user("and what colour is it?")]
    after = ServingEngine(engine, ServingOptions(disk=DiskStore(tmp_path, 10**9, 0)))
    encoded = _encoded(engine)
    events = list(after.submit(_ask(follow_up, long_reply)).events(timeout=TIMEOUT))
    served = events[-1]
    started = next(e for e in events if isinstance(e, RequestStarted))
    assert started.cached_from == "disk" and _encoded(engine) == encoded  # the picture came back from disk
    restored = max(after.pool._entries.values(), key=lambda p: p.length)
    assert restored.spans and restored.rope_delta < 0  # with the picture's positions
    reference = _run(ServingEngine(engine, ServingOptions(pool_bytes=1)), _ask(follow_up, long_reply))
    assert served.text == reference.text and len(served.text) > 20
