"""4 clients at once with `--kv-bits 8` against the same without, side by side in one run (in process, no HTTP).

For each setting, `--clients` requests (greedy, end-of-turn tokens banned, `--tokens` tokens each, thinking off)
are submitted to a ServingEngine at the same moment; aggregate tok/s is all their completion tokens over the
wall time from the first submit to the last Completed. Then the short request during a long reply: a
`--long`-token reply streams and, once its first token is in, a short request is sent; its time to Completed is
what it waits (before batching quantized KV, with --kv-bits it waited for the whole long reply). Settings are
interleaved and repeated (`--repeat`); each figure is the median.

    .venv/bin/python bench/kv_batch.py [--model FOLDER] [--clients 4] [--tokens 64] [--long 400] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from macapp.core.engine import Engine, SessionOptions
from macapp.core.events import AnswerDelta
from macapp.core.sampling import greedy
from macapp.core.serving.requests import ChatMessage, CompletionRequest, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions

TIMEOUT = 900


def _request(engine: Engine, text: str, tokens: int) -> CompletionRequest:
    vocab = engine.model.tokenizer.get_vocab() if engine.model is not None else {}
    banned = {vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9}
    return CompletionRequest(messages=(ChatMessage(Role.USER, text),), sampling=greedy(tokens, logit_bias=banned), thinking=False)


def clients_round(engine: Engine, kv_bits: int | None, clients: int, tokens: int) -> float:
    serving = ServingEngine(engine, ServingOptions(pool_bytes=0, session=SessionOptions(kv_bits=kv_bits)))
    requests = [_request(engine, f"Client {i}: tell me about the sea " * (i + 1), tokens) for i in range(clients)]
    gate = threading.Event()
    held = engine.submit("hold", lambda job: gate.wait(TIMEOUT))
    start = time.perf_counter()
    jobs = [serving.submit(r) for r in requests]
    gate.set()
    held.join(TIMEOUT)
    done = [job.wait(TIMEOUT) for job in jobs]
    wall = time.perf_counter() - start
    serving.close()
    return sum(d.usage.completion_tokens for d in done) / wall


def short_during_long(engine: Engine, kv_bits: int | None, long: int) -> float:
    serving = ServingEngine(engine, ServingOptions(pool_bytes=0, session=SessionOptions(kv_bits=kv_bits)))
    job = serving.submit(_request(engine, "Tell me a long story about the sea", long))
    streaming = threading.Event()
    job.add_listener(lambda e: streaming.set() if isinstance(e, AnswerDelta) else None)
    streaming.wait(TIMEOUT)
    sent = time.perf_counter()
    serving.submit(_request(engine, "A title, please", 10)).wait(TIMEOUT)
    waited = time.perf_counter() - sent
    job.wait(TIMEOUT)
    serving.close()
    return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: the tiny MoE model, built now)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--long", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from macapp.core.demo.tiny_model import make_tiny_model

        model = str(make_tiny_model(Path(tempfile.mkdtemp()) / "tiny-moe", kind="moe"))
    engine = Engine()
    engine.load(model).result(timeout=TIMEOUT)
    tps: dict[int | None, list[float]] = {None: [], 8: []}
    short: dict[int | None, list[float]] = {None: [], 8: []}
    for _ in range(args.repeat):
        for bits in (None, 8):
            tps[bits].append(clients_round(engine, bits, args.clients, args.tokens))
            short[bits].append(short_during_long(engine, bits, args.long))
    engine.close()
    plain, quant = statistics.median(tps[None]), statistics.median(tps[8])
    print(f"| setting | {args.clients} clients tok/s (median of {args.repeat}) | vs no --kv-bits | short request during a {args.long}-token reply, s |")
    print("|---|---|---|---|")
    print(f"| no --kv-bits | {plain:.1f} | 1.00x | {statistics.median(short[None]):.2f} |")
    print(f"| --kv-bits 8 | {quant:.1f} | {quant / plain:.2f}x | {statistics.median(short[8]):.2f} |")


if __name__ == "__main__":
    main()
