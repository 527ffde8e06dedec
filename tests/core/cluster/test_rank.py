"""Rank 0's engine (cluster/rank.py Rank0Engine), on a group of one rank (the collectives run, with nobody else):
the app's Engine calling the model through the LockstepModel proxy (engine/model_proxy.py), one request at a time,
pictures refused by the proxy's own word, and closing the engine closes the proxy (the followers are told to end)."""

from __future__ import annotations

import pytest

from macapp.core.cluster.lockstep import LockstepModel
from macapp.core.cluster.rank import Rank0Engine, RankSpec, engine_for_rank0
from macapp.core.cluster.split import Shard
from macapp.core.engine import Engine, EngineError
from macapp.core.engine.model_proxy import ModelProxy, close_proxy, pictures_refusal
from macapp.core.engine.pictures import vision_for
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT, on_worker


@pytest.fixture
def rank0(tiny_dense_path):
    import mlx.core as mx

    engine = engine_for_rank0(RankSpec(Shard.TENSOR, "ring", 1), group=mx.distributed.init())
    engine.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
    yield engine
    engine.close()


def test_rank0_runs_the_engine_through_the_proxy_one_request_at_a_time(rank0, tiny_dense_path):
    assert isinstance(rank0, Rank0Engine) and type(rank0).__module__ == "macapp.core.cluster.rank"
    proxy = on_worker(rank0, lambda m: m.model)
    assert isinstance(proxy, LockstepModel) and isinstance(proxy, ModelProxy)
    reply = rank0.new_session().send("hi", thinking=False, sampling=greedy(6)).result(timeout=TIMEOUT)
    alone = Engine()
    try:
        alone.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
        same = alone.new_session().send("hi", thinking=False, sampling=greedy(6)).result(timeout=TIMEOUT)
    finally:
        alone.close()
    assert reply.token_ids == same.token_ids  # the proxy changes how the model is called, not what it computes
    loop = rank0.batch_loop()  # its loop runs every sequence alone: no mlx-lm batch over the lockstep channel
    assert not rank0.batches and loop.alone >= 1 and loop.peak == 1 and loop.steps > 0


def test_pictures_are_refused_by_the_proxy_before_the_folder_is_looked_at(rank0):
    def attach(m):
        assert pictures_refusal(m.model) == LockstepModel.pictures_refusal
        with pytest.raises(EngineError, match="not supported on several Macs yet"):
            vision_for(m)
        return True

    assert on_worker(rank0, attach)


def test_closing_the_engine_closes_the_proxy(tiny_dense_path):
    import mlx.core as mx

    engine = engine_for_rank0(RankSpec(Shard.TENSOR, "ring", 1), group=mx.distributed.init())
    engine.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
    proxy = on_worker(engine, lambda m: m.model)
    assert not proxy.closed and not engine.closed
    engine.close()
    assert engine.closed and proxy.closed  # SHUTDOWN was sent: the followers exit 0
    close_proxy(proxy)  # closing again tells nobody and raises nothing
    close_proxy(object())  # a plain model is not a proxy: nothing to close
