"""One request alone: decode speed through the batch loop vs a server with batching off, same engine, same run (by hand).

    .venv/bin/python bench/batch_solo.py [--model PATH] [--tokens 256] [--repeat 7]
    .venv/bin/python bench/batch_solo.py --mtp right|random [--layers 32]   # + the lone request drafting with MTP
    .venv/bin/python bench/batch_solo.py --companion 16 [--mtp right]   # + a short request sharing the batch at first

Issue 18's target: batching must not slow a single client (>= 0.97x). Since issue 30 both run the same lone
executor (engine/solo.py; `ServingOptions(batching=False)` runs every request alone, never in mlx-lm's batch), so this
checks that the loop's admission costs nothing; the lone executor against raw mlx-lm is bench/engine_bench.py. They are
compared in one process, interleaved, greedy, end-of-turn tokens banned so every reply is `--tokens`
long. Decode tok/s is the engine's own figure (tokens after the first over the time after the first).
A request alone in the batch runs outside mlx-lm's generator (core/engine/solo.py) until another arrives.
With `--mtp` the tiny model gets an MTP head (always right, or random: macapp/core/demo/tiny_model.py, as
bench/mtp_bench.py) and the lone request in the batch also runs with `--mtp auto` and `on` (issue 21: MTP for a
batch of one); those replies are checked token for token against the plain batch's.
With `--companion N` each batch path also runs the request beside a short one (N tokens) that the batch takes
with it: the batch decodes both plainly, then the request left alone goes on outside the batch, drafting again
with MTP (engine/batch.py `alone_again`); its tok/s is compared with the same path's lone run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: a tiny random 16-layer Qwen3.5, built now)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--mtp", choices=("right", "random"), help="give the tiny model this MTP head and time the lone request drafting too")
    parser.add_argument("--layers", type=int, default=16, help="the tiny model's layers (hidden 64)")
    parser.add_argument("--companion", type=int, default=0, help="also run each batch path beside a short request of this many tokens")
    args = parser.parse_args()
    from macapp.core.engine import Engine, SessionOptions
    from macapp.core.engine.options import MTPMode
    from macapp.core.sampling import greedy
    from macapp.core.serving.requests import ChatMessage, Completed, CompletionRequest, Role
    from macapp.core.serving.runner import ServingEngine, ServingOptions
    from macapp.core.demo.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="batch-solo-") as tmp:
        model = args.model or str(make_tiny_model(Path(tmp) / f"tiny-{args.layers}", kind="dense", num_layers=args.layers, mtp=args.mtp))
        engine = Engine()
        engine.load(model).result(600)
        tok = engine.model.tokenizer
        banned = {i: -1e9 for i in {*tok.eos_token_ids, engine.model.im_end_id} if i is not None}
        request = CompletionRequest(
            messages=(ChatMessage(Role.USER, "Write at length about rivers."),),
            sampling=greedy(args.tokens, logit_bias=banned),
        )
        plain = SessionOptions(mtp=MTPMode.OFF)
        paths = {
            "batch": ServingEngine(engine, ServingOptions(session=plain, pool_bytes=0)),
            "one at a time": ServingEngine(engine, ServingOptions(session=plain, pool_bytes=0, batching=False)),
        }
        if args.mtp:
            for mode in (MTPMode.AUTO, MTPMode.ON):
                paths[f"batch, MTP {mode.value}"] = ServingEngine(engine, ServingOptions(session=SessionOptions(mtp=mode), pool_bytes=0))
        companion = CompletionRequest(messages=(ChatMessage(Role.USER, "And briefly, lakes?"),), sampling=greedy(args.companion, logit_bias=banned))
        shared = {f"{name} + companion": serving for name, serving in paths.items() if args.companion and name.startswith("batch")}
        left_in = "batch, MTP auto + companion, left in the batch"  # as before engine/batch.py's alone_again
        if args.companion and args.mtp:
            shared[left_in] = paths["batch, MTP auto"]

        def beside(serving: ServingEngine, stay: bool = False) -> Completed:
            """The request and the companion, taken by the batch together (the worker is held while both queue);
            `stay`: the one left goes on in the batch (the engine's one BatchLoop, for this run only)."""
            loop = engine.batch_loop()
            assert loop is not None
            if stay:
                loop._alone_again = lambda *_: None  # type: ignore[method-assign]  # this bench's "before" only
            try:
                return together(serving)
            finally:
                loop.__dict__.pop("_alone_again", None)

        def together(serving: ServingEngine) -> Completed:
            release = threading.Event()
            blocker = engine.submit("bench", lambda _job: release.wait(600))
            jobs = [serving.submit(request), serving.submit(companion)]
            release.set()
            blocker.wait(600)
            done, other = (job.wait(600) for job in jobs)
            assert isinstance(done, Completed) and isinstance(other, Completed), (done, other)
            return done

        for serving in paths.values():  # warm-up
            serving.submit(request).wait(600)
        speeds: dict[str, list[float]] = {name: [] for name in [*paths, *shared]}
        per_step: dict[str, list[float]] = {name: [] for name in [*paths, *shared]}
        for _ in range(args.repeat):
            texts = {}
            for name, serving in [*paths.items(), *shared.items()]:
                done = beside(serving, stay=name == left_in) if name in shared else serving.submit(request).wait(600)
                assert done.usage.completion_tokens == args.tokens, done
                speeds[name].append(done.generation_tps)
                per_step[name].append(done.mtp_tokens_per_step or 1.0)
                texts[name] = done.text
            assert all(text == texts["batch"] for text in texts.values()), "a path's reply differs from the plain batch's"

        engine.close()
    batch, alone = statistics.median(speeds["batch"]), statistics.median(speeds["one at a time"])
    print("## One request alone: the batch vs the one-at-a-time path (bench/batch_solo.py)\n")
    print(
        f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. Date: {datetime.now(timezone.utc):%Y-%m-%d}. "
        f"Model: {args.model or f'tiny random Qwen3.5, dense, {args.layers} layers'}. {args.tokens} tokens, greedy, medians of {args.repeat} interleaved runs.\n"
    )
    pairs = statistics.median(b / a for b, a in zip(speeds["batch"], speeds["one at a time"]))
    print(f"- decode tok/s: batch {batch:.1f}, one at a time {alone:.1f}: ratio {batch / alone:.3f} (target >= 0.97)")
    print(f"- median of the ratios of back-to-back pairs (cancels a machine whose load drifts): {pairs:.3f}")
    print(f"- every run, batch: {', '.join(f'{v:.0f}' for v in speeds['batch'])}; one at a time: {', '.join(f'{v:.0f}' for v in speeds['one at a time'])}")
    for name in [n for n in paths if n.startswith("batch, MTP")]:
        tps = statistics.median(speeds[name])
        pair = statistics.median(m / b for m, b in zip(speeds[name], speeds["batch"]))
        print(
            f"- {name} ({args.mtp} head): {tps:.1f} tok/s, {tps / batch:.2f}x the plain batch (pairs {pair:.2f}x), {statistics.median(per_step[name]):.2f} tokens per verify pass"
        )
    for name in shared:
        lone = name.split(" + companion")[0]
        tps, alone_tps = statistics.median(speeds[name]), statistics.median(speeds[lone])
        print(
            f"- {name} ({args.companion} tokens): {tps:.1f} tok/s, {tps / alone_tps:.2f}x the same path alone, "
            f"{statistics.median(per_step[name]):.2f} tokens per verify pass"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
