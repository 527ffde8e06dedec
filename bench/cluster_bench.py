"""Several Macs benchmark (run by hand): decode tok/s on one process vs two ranks of the same model.

    .venv/bin/python bench/cluster_bench.py [--quick] > /tmp/cluster_bench.md

On this machine the two ranks share one CPU over the loopback (ring backend, 127.0.0.1 twice in the
hostfile), so this measures the cost of running in lockstep (the command header broadcast with each model
call, the layers' exchanges, the eager evaluation per call; the app's own part alone is measured too, on a
group of one), NOT the speed-up several Macs give: two Macs each
read half the weights (tensor split) from their own memory; here both ranks read from the same memory on the
same cores. Same model, greedy, end-of-reply tokens banned so every run makes exactly N tokens; one process
and two ranks alternate, medians compared. Two models: the test model (hidden 64) and a small one (hidden 512,
8 layers, MoE). Prints a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def generate(engine, model: str, tokens: int, runs: int) -> list[float]:
    """Decode tok/s of `runs` replies of exactly `tokens` tokens each on `engine`."""
    from macapp.core.sampling import greedy

    engine.load(model).result(timeout=600)
    vocab = engine.model.tokenizer.get_vocab()
    bias = {vocab["<|im_end|>"]: -1e4, vocab["<|endoftext|>"]: -1e4}
    out = []
    for i in range(runs):
        session = engine.new_session()
        reply = session.send(f"Tell me about run {i}.", thinking=False, sampling=greedy(tokens, logit_bias=bias)).result(timeout=600)
        assert len(reply.token_ids) == tokens, reply.finish_reason
        out.append(reply.stats.generation_tps)
    return out


def rank_main(model: str, tokens: int, runs: int) -> int:
    """Inside mlx.launch: rank 0 measures through the cluster engine, the other ranks follow."""
    from macapp.core.cluster import rank

    spec = rank.launched_spec()
    if rank.rank() != 0:
        return rank.follow(spec, model)
    engine = rank.engine_for_rank0(spec)
    try:
        print(json.dumps(generate(engine, model, tokens, runs)), flush=True)
    finally:
        engine.close()
    return 0


def latency_main(n: int = 300) -> int:
    """Inside mlx.launch: the round trip of one tiny all_sum (what each command header and each layer's
    exchange costs at the least)."""
    import time

    import mlx.core as mx

    group = mx.distributed.init(strict=True)
    x = mx.zeros((16,), dtype=mx.int32)
    for _ in range(20):
        mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
    start = time.perf_counter()
    for _ in range(n):
        mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
    if group.rank() == 0:
        print(json.dumps((time.perf_counter() - start) / n * 1e3), flush=True)
    return 0


def all_sum_ms(hostfile: Path) -> float:
    from macapp.core.cluster.launch import mlx_launch

    done = subprocess.run(
        [mlx_launch(), "--hostfile", str(hostfile), "--backend", "ring", "--", sys.executable, str(Path(__file__).resolve()), "--latency"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return float(done.stdout.strip().splitlines()[-1])


def one_process(model: str, tokens: int, runs: int) -> list[float]:
    from macapp.core.engine import Engine

    engine = Engine()
    try:
        return generate(engine, model, tokens, runs)
    finally:
        engine.close()


def lockstep_alone(model: str, tokens: int, runs: int) -> list[float]:
    """One process through the lockstep layer (LockstepModel on a group of one: the collectives are no-ops)."""
    import mlx.core as mx

    from macapp.core.cluster.rank import reader_for_rank0
    from macapp.core.cluster.split import Shard
    from macapp.core.engine import Engine

    engine = Engine(read_model=reader_for_rank0(mx.distributed.init(), Shard.TENSOR))
    try:
        return generate(engine, model, tokens, runs)
    finally:
        engine.close()


def two_ranks(model: str, shard: str, tokens: int, runs: int, hostfile: Path) -> list[float]:
    from macapp.core.cluster.launch import ClusterRun, prepare
    from macapp.core.cluster.split import Shard

    plan = prepare(hostfile, "ring", model, Shard(shard))
    command = [sys.executable, str(Path(__file__).resolve()), "--rank", model, "--tokens", str(tokens), "--runs", str(runs)]
    run = ClusterRun(plan, command, stdout=subprocess.PIPE)
    run.start()
    out = run.proc.stdout.read().decode()
    code = run.wait()
    run.close()
    if code != 0:
        raise SystemExit(f"cluster run failed ({code}): {run.fault or out}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rank", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--latency", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args.rank, args.tokens, args.runs)
    if args.latency:
        return latency_main()

    from macapp.core.demo.tiny_model import make_tiny_model

    tokens, runs, rounds = (32, 2, 1) if args.quick else (args.tokens, args.runs, 3)
    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    hostfile = work / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    models = {
        "test model (hidden 64, 4 layers, MoE)": make_tiny_model(work / "tiny", kind="moe"),
        "small model (hidden 512, 8 layers, MoE)": make_tiny_model(work / "small", kind="moe", hidden_size=512, num_layers=8),
    }
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## Several Macs, measured on one (bench/cluster_bench.py) — {when}\n")
    print(f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores (shared), MLX on the CPU; two ranks on 127.0.0.1 over the ring backend.")
    print("This is the overhead of lockstep on one machine, not the speed-up of several Macs (see the script's docstring).")
    print(f"{tokens} tokens per reply, {runs} replies per run, {rounds} alternating rounds, medians of decode tok/s.\n")
    print("| model | one process | lockstep layer alone | ratio | two ranks, tensor | ratio | two ranks, pipeline | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, path in models.items():
        one, alone, tensor, pipe = [], [], [], []
        for _ in range(rounds):
            one += one_process(str(path), tokens, runs)
            alone += lockstep_alone(str(path), tokens, runs)
            tensor += two_ranks(str(path), "tensor", tokens, runs, hostfile)
            pipe += two_ranks(str(path), "pipeline", tokens, runs, hostfile)
        a, l, t, p = (statistics.median(x) for x in (one, alone, tensor, pipe))
        print(f"| {name} | {a:.1f} | {l:.1f} | {l / a:.2f} | {t:.1f} | {t / a:.2f} | {p:.1f} | {p / a:.2f} |")
    print(f"\nOne 64-byte all_sum between the two ranks in a tight loop (ring, loopback): {all_sum_ms(hostfile):.2f} ms.")
    print("A generated token costs one command header plus, in tensor mode, two all_sums per layer and a gather of the")
    print("output head; in pipeline mode one send per stage and a gather. 'Lockstep layer alone' is rank 0's wrapping")
    print("(header, eager evaluation of the last position) on a group of one: what the app adds without a second rank.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
