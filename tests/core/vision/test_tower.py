"""The vision tower is a capability of one loaded model (vision/tower.py, LoadedModel.tower): attached into the model's
own slot when a picture first needs it, shared by every view of that model, and gone with the model; no module global."""

from __future__ import annotations

import dataclasses
import gc
import weakref

from macapp.core.engine import Engine
from macapp.core.engine.pictures import attached_bytes, vision_for
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT, on_worker


def test_the_tower_is_the_loaded_models_and_goes_with_it(tiny_vlm_path, picture):
    engine = Engine()
    try:
        engine.load(str(tiny_vlm_path)).result(timeout=TIMEOUT)
        assert on_worker(engine, lambda m: (m.tower.vision, attached_bytes(m))) == (None, 0)  # text-only so far
        engine.new_session().send("x", thinking=False, sampling=greedy(2), images=[picture("t.png", (64, 64))]).result(timeout=TIMEOUT)

        def held(m):
            view = dataclasses.replace(m, weights_bytes=1)  # a view of the same model (as a turn makes) shares the slot
            assert view.tower is m.tower and vision_for(view) is m.tower.vision
            return weakref.ref(m.tower.vision), attached_bytes(m)

        tower, nbytes = on_worker(engine, held)
        assert tower() is not None and nbytes == tower().vision_bytes > 0
        engine.load(str(tiny_vlm_path)).result(timeout=TIMEOUT)  # the same build again: a new loaded model, its own slot
        assert on_worker(engine, lambda m: m.tower.vision) is None
        gc.collect()
        assert tower() is None  # the first model's tower went with it
    finally:
        engine.close()


def test_two_loaded_models_keep_their_own_towers(engine, picture):
    """The tower attached for one loaded model is never handed to another (the module global used to be one slot)."""

    def two(m):
        other = dataclasses.replace(m, tower=type(m.tower)())  # another model of the same folder: an empty slot
        first, second = vision_for(m), vision_for(other)
        return first is not second and m.tower.vision is first and other.tower.vision is second

    assert on_worker(engine, two)
