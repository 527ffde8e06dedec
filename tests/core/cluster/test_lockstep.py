"""Two ranks on this machine over MLX's ring backend run the app's engine in lockstep: the same greedy tokens
as one process, for dense and MoE models, tensor and pipeline splits, through regenerate, edit and a stop."""

import subprocess

from macapp.core.cluster.launch import ClusterRun, prepare
from macapp.core.engine import Engine
from tests.core.cluster.conftest import drive_command, records
from tests.core.cluster.drive import run_turns

MAX_TOKENS = 8


def one_process(model):
    engine = Engine()
    try:
        return run_turns(engine, str(model), MAX_TOKENS)
    finally:
        engine.close()


def test_two_ranks_give_the_tokens_of_one_process(two_local, tiny_dense_path, tiny_moe_path):
    items = [f"{tiny_dense_path}:tensor", f"{tiny_dense_path}:pipeline", f"{tiny_moe_path}:tensor", f"{tiny_moe_path}:pipeline:stop"]
    run = ClusterRun(prepare(two_local, "ring", str(tiny_moe_path), None), drive_command(*items, max_tokens=MAX_TOKENS, stop_after=3), stdout=subprocess.PIPE)
    run.start()
    out = run.proc.stdout.read().decode()
    assert run.wait() == 0, out
    run.close()
    got = [r for r in records(out) if "tokens" in r or "failed" in r]
    assert not [r for r in got if "failed" in r]
    expected = {str(m): [r["tokens"] for r in one_process(m) if "tokens" in r] for m in (tiny_dense_path, tiny_moe_path)}
    for model, shard in ((tiny_dense_path, "tensor"), (tiny_dense_path, "pipeline"), (tiny_moe_path, "tensor")):
        turns = [r for r in got if r["model"] == str(model) and r["shard"] == shard]
        assert [r["tokens"] for r in turns] == expected[str(model)], (model, shard)
        assert [r["kind"] for r in turns] == ["send", "regenerate", "send", "edit"]
    stopped = [r for r in got if r["model"] == str(tiny_moe_path) and r["shard"] == "pipeline"]
    first = stopped[0]
    assert first["finish_reason"] == "stopped" and 0 < len(first["tokens"]) < MAX_TOKENS
    assert first["tokens"] == expected[str(tiny_moe_path)][0][: len(first["tokens"])]
    # after the stop the ranks are still in step: regenerate, send and edit give one process's tokens
    assert [r["tokens"] for r in stopped[1:]] == expected[str(tiny_moe_path)][1:]
