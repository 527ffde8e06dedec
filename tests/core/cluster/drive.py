"""Scripted chats through the app's engine, in one process or as a rank of a cluster run (tests and bench).

    python -m tests.core.cluster.drive MODEL[:tensor|:pipeline][:stop] ... [--stop-after N] [--max-tokens N]

Alone (no MLX_RANK) it is one process. Started by mlx.launch with QWEN_DESK_CLUSTER set, rank 0 drives the
turns through macapp.core.cluster (each model with its own split) and the other ranks follow. Rank 0 (or the
one process) prints one JSON line per turn: model, kind, token ids, finish reason, tok/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

TURNS = [("send", "Tell me a story about a cat."), ("regenerate", None), ("send", "And a dog?"), ("edit", "And a bird?")]


def run_turns(engine, model: str, max_tokens: int, stop_after: int | None = None, turns: int = len(TURNS), kv_bits: int | None = None) -> list[dict]:
    """Load `model` on `engine` and run the scripted turns (off the tiny model's script: long, context-dependent text)."""
    from macapp.core.engine import SessionOptions
    from macapp.core.events import AnswerDelta, Finished, ReasoningDelta
    from macapp.core.sampling import greedy

    engine.load(model).result(timeout=300)
    vocab = engine.model.tokenizer.get_vocab()
    bias = {vocab["<|im_end|>"]: -1e4, vocab["<|endoftext|>"]: -1e4}
    session = engine.new_session(options=SessionOptions(kv_bits=kv_bits))
    out = []
    for n, (kind, text) in enumerate(TURNS[:turns]):
        sampling = greedy(max_tokens, logit_bias=bias)
        if kind == "send":
            job = session.send(text, thinking=False, sampling=sampling)
        elif kind == "regenerate":
            job = session.regenerate(thinking=False, sampling=sampling)
        else:
            job = session.edit_last(text, thinking=False, sampling=sampling)
        pieces = 0

        def on_event(event, n=n) -> None:  # on the worker thread: the stop lands at the same piece every run
            nonlocal pieces
            if isinstance(event, (AnswerDelta, ReasoningDelta)):
                pieces += 1
                if n == 0 and pieces == 1:
                    print(json.dumps({"model": model, "streaming": True}), flush=True)
                if n == 0 and stop_after is not None and pieces == stop_after:
                    job.stop()

        job.add_listener(on_event)
        last = job.wait()
        if not isinstance(last, Finished):
            out.append({"model": model, "turn": n, "kind": kind, "failed": last.message})
            break
        r = last.reply
        out.append({"model": model, "turn": n, "kind": kind, "tokens": r.token_ids, "finish_reason": r.finish_reason, "generation_tps": r.stats.generation_tps})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", help="model folder, optionally :tensor or :pipeline, then :stop to stop its first reply")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--stop-after", type=int, default=3, help="where a :stop model's first reply is stopped (streamed pieces)")
    parser.add_argument("--turns", type=int, default=len(TURNS))
    parser.add_argument("--kv-bits", type=int, choices=(4, 8))
    parser.add_argument("--follower-model", help="the other ranks read this folder instead (as a host with other files would)")
    parser.add_argument("--follower-stall", type=float, default=0.0, help="the other ranks sleep this long after joining (as a host stuck while loading)")
    args = parser.parse_args(argv)

    from macapp.core.cluster import rank
    from macapp.core.cluster.split import Shard
    from macapp.core.engine import Engine

    spec = rank.launched_spec()
    group = None
    if spec is not None:
        group = rank.start_rank0(spec) if rank.rank() == 0 else rank.join(spec)
    for item in args.models:
        path, _, rest = item.partition(":")
        shard, _, stop = rest.partition(":")
        item_spec = dataclasses.replace(spec, shard=Shard(shard)) if spec is not None and shard else spec
        if spec is not None and rank.rank() != 0:
            time.sleep(args.follower_stall)
            code = rank.follow(item_spec, args.follower_model or path, group)
            if code:
                return code
            continue
        engine = rank.engine_for_rank0(item_spec, group) if spec is not None else Engine()
        try:
            stop_after = args.stop_after if stop == "stop" else None
            for record in run_turns(engine, path, args.max_tokens, stop_after, args.turns, args.kv_bits):
                print(json.dumps(dict(record, shard=shard or None)), flush=True)
                if "failed" in record:
                    return 1
        finally:
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
