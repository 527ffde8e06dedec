"""MTP benchmark (run by hand): plain decoding vs speculative decoding with the model's own MTP head, one run.

    .venv/bin/python bench/mtp_bench.py [--hidden 64] [--layers 32] [--tokens 64] [--repeat 3] [--prompt-repeat 1]
    .venv/bin/python bench/mtp_bench.py --model PATH [--tokens 256]     # a real build with its head (a Mac)

Without --model it builds two tiny dense Qwen3.5 models of the real architecture (macapp/core/demo/tiny_model.py):
one whose MTP head is always right (the upper bound: the model's greedy next token is the successor of the
token before it, and the head is built to draft that successor), one with a random head (the worst case).
The default size (hidden 64, 32 layers) is where a verify pass costs about what a plain step costs, as on a
GPU, and the head's one layer is a small part of the model. On this CPU that is not so at larger sizes: MLX's
CPU matmul and mlx-lm's CPU Gated DeltaNet (a loop over the tokens) cost about the same per token whether one
or five are read, so at 512 x 16 even an always-right head gains nothing (and auto turns it off); at the
tests' 64 x 4 the head's layer is a quarter of the model.

Each model is calibrated first, as `Engine.load` does in "auto" (mtp_calibration.py, in a fresh app home so no
remembered verdict is used): the time it took and the verdict are printed. Each reply goes through the engine's
own lone executor (engine/solo.py run_alone: greedy, thinking on, eos banned so every reply runs to --tokens) in a fresh cache after one
of three prompts, with a fresh DepthPolicy (a new conversation: the worst case for probing), and the head's
context fed while reading the prompt where the reply may draft, as a chat session does. Modes, interleaved
round by round so they see the same machine load: off; "auto, no verdict" (auto as before the calibration:
probe steps and exploring rounds in every new conversation); auto (from the build's calibrated verdict: what
`qwen-desk chat --mtp auto` runs); on. Per mode: decode tok/s (the engine's generation_tps: from the first
token to the last), the main model's forward passes per generated token, acceptance and tokens per verify
step, whether auto ended plain, and the prompt's reading time against plain's (`--prompt-repeat N` makes the
prompts N times longer to see the head context's cost). Every MTP reply is checked token for token against the
plain one.
Targets on this machine (64-token replies): always-right head >= 1.6x plain with auto; random head >= 0.95x plain
with auto.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("off", "auto, no verdict", "auto", "on")
PROMPTS = (
    "Tell me about the local model cache and why a small model reads fast on apple silicon.",
    "Write a Python function that merges two sorted lists, and explain its running time.",
    "List five things to pack for a week of hiking in the mountains in autumn.",
)


@dataclass
class Runs:
    tps: list[float] = field(default_factory=list)
    passes: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)
    per_step: list[float] = field(default_factory=list)
    turned_off: int = 0
    read_s: list[float] = field(default_factory=list)
    tokens: list[int] | None = None


def one_reply(m, mode: str, tokens: int, prompt: str, prompt_repeat: int = 1):
    """One greedy reply after `prompt` (repeated) through prefill and the lone executor (engine/solo.py), with the head's context where MTP
    may draft, as a chat session runs it; (reply, policy, seconds reading the prompt)."""
    import time

    from macapp.core.engine.clock import TurnClock
    from macapp.core.engine.mtp_policy import DepthPolicy
    from macapp.core.engine.options import KVQuantization, MTPMode
    from macapp.core.engine.prefill import prefill, wired_memory
    from macapp.core.engine.prompt_cache import PromptCache
    from macapp.core.engine import Job, Limits, Sequence, SequenceReply, run_alone
    from macapp.core.engine.reply import head_context, pick_policy
    from macapp.core.sampling import greedy, make_sampler_and_processors

    vocab = m.tokenizer.get_vocab()
    params = greedy(tokens, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})
    text = " ".join([prompt] * prompt_repeat)
    ids = list(m.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=True))
    cache = PromptCache.new(m)
    mtp = MTPMode(mode.split(",")[0])
    verdict = m.mtp_head.verdict if m.mtp_head is not None else None
    if verdict is not None and mode == "auto, no verdict":
        m.mtp_head.verdict = None  # auto as it ran before the calibration
    try:
        policy = DepthPolicy(mtp)
        context = head_context(m, cache, pick_policy(m, cache.layers, KVQuantization(), mtp, policy))
        clock = TurnClock()
        with wired_memory(m):
            clock.reading(len(ids))
            start = time.perf_counter()
            prefill(m, cache.layers, ids[:-1], head=context)
            read_s = time.perf_counter() - start
            sampler, processors = make_sampler_and_processors(params)
            cache.extend(ids[:-1])
            reply = SequenceReply(
                m,
                limits=Limits(cached=len(ids) - 1, limit=len(ids) + tokens + 8),
                segment=ids[-1:],
                params=params,
                thinking=True,
                budget=None,
                should_stop=lambda: False,
                emit=lambda _e: None,
                clock=clock,
            )
            seq = Sequence(job=Job("bench"), prompt=cache, segments=[ids[-1:]], sampler=sampler, processors=processors, reply=reply, mtp=mtp, mtp_policy=policy)
            streamed = run_alone(m, seq)
            assert streamed is not None
    finally:
        if m.mtp_head is not None:
            m.mtp_head.verdict = verdict
    return streamed.reply, policy, read_s


def bench(models: dict[str, object], tokens: int, repeat: int, prompt_repeat: int = 1) -> dict[tuple[str, str], Runs]:
    runs = {(name, mode): Runs() for name in models for mode in MODES}
    for name, m in models.items():  # warm-up: MLX's first calls of each shape
        for mode in MODES:
            one_reply(m, mode, 8, PROMPTS[0], prompt_repeat)
    plain: dict[tuple[str, str], list[int]] = {}
    for _ in range(repeat):
        for prompt in PROMPTS:
            for name, m in models.items():
                for mode in MODES:
                    reply, policy, read_s = one_reply(m, mode, tokens, prompt, prompt_repeat)
                    r = runs[(name, mode)]
                    r.read_s.append(read_s)
                    st = reply.stats
                    r.tps.append(st.generation_tps)
                    steps = st.mtp_steps
                    r.passes.append(_passes(reply) / max(st.generation_tokens, 1))
                    r.acceptance.append(st.mtp_acceptance if steps else 0.0)
                    r.per_step.append(st.mtp_tokens_per_step if steps else 0.0)
                    r.turned_off += int(policy.off)
                    expected = plain.setdefault((name, prompt), reply.token_ids)
                    if reply.token_ids != expected:
                        raise SystemExit(f"{name} {mode}: the reply differs from plain decoding")
    return runs


def _passes(reply) -> int:
    """The main model's forward passes for this reply (plain decoding reads one token per pass)."""
    return reply.stats.mtp_passes if reply.stats.mtp_steps else reply.stats.generation_tokens


def build_models(hidden: int, layers: int, folder: Path) -> dict[str, object]:
    from macapp.core.engine.model_folder import check_model_folder, load_model
    from macapp.core.demo.tiny_model import make_tiny_model

    out = {}
    for head in ("right", "random"):
        path = make_tiny_model(folder / f"dense-{hidden}x{layers}-{head}", "dense", hidden_size=hidden, num_layers=layers, mtp=head)
        out[f"{head} head"] = load_model(path, check_model_folder(path))
    return out


def calibrated(models: dict[str, object]) -> list[str]:
    """Calibrate each model as Engine.load does in "auto" (in a fresh app home: nothing remembered); one line each."""
    import time

    from macapp.core.engine.mtp_calibration import calibrate

    lines = []
    for name, m in models.items():
        start = time.perf_counter()
        verdict = calibrate(m)
        took = time.perf_counter() - start
        if verdict is None:
            lines.append(f"- {name}: no verdict (the calibration failed, see the log)")
            continue
        widths = ", ".join(f"{w}: {s * 1e3:.1f} ms" for w, s in sorted(verdict.verify_s.items()))
        lines.append(
            f"- {name}: calibrated in {took:.2f} s: {'drafts' if verdict.drafts else 'plain'} "
            f"(plain step {verdict.plain_s * 1e3:.1f} ms, verify by width {widths}, draft {verdict.draft_s * 1e3:.1f} ms; {verdict.reason})"
        )
    return lines


def table(runs: dict[tuple[str, str], Runs], names: list[str]) -> str:
    lines = [
        "| model | mode | decode tok/s (median) | vs plain | passes / token | acceptance | tokens / step | auto ended plain | prompt read vs plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        base = statistics.median(runs[(name, "off")].tps)
        base_read = statistics.median(runs[(name, "off")].read_s)
        for mode in MODES:
            r = runs[(name, mode)]
            tps = statistics.median(r.tps)
            lines.append(
                f"| {name} | {mode} | {tps:.1f} | {tps / base:.2f}x | {statistics.median(r.passes):.2f} | "
                f"{statistics.median(r.acceptance):.0%} | {statistics.median(r.per_step):.2f} | "
                f"{r.turned_off}/{len(r.tps) if mode.startswith('auto') else 0} | {statistics.median(r.read_s) / base_read:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a real build with an MTP head (default: the two tiny scripted models)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="rounds over the three prompts")
    parser.add_argument("--prompt-repeat", type=int, default=1, help="the prompt this many times over (the head's context costs prompt reading)")
    args = parser.parse_args(argv)

    import mlx.core as mx

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["QWEN_DESK_HOME"] = str(Path(tmp) / "home")  # a fresh calibration, none remembered
        if args.model:
            from macapp.core.engine.model_folder import check_model_folder, load_model, locate_model

            path = locate_model(args.model)
            m = load_model(path, check_model_folder(path))
            if m.mtp_head is None:
                print(f"{path.name}: no usable MTP head ({m.mtp_problem or 'none in the build or beside it'})", file=sys.stderr)
                return 1
            models = {path.name: m}
        else:
            models = build_models(args.hidden, args.layers, Path(tmp))
        verdicts = calibrated(models)
        runs = bench(models, args.tokens, args.repeat, args.prompt_repeat)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    size = args.model or f"tiny dense {args.hidden} x {args.layers} layers, float32"
    print(
        f"MTP bench {when} · {platform.machine()} {platform.system()} · mlx {mx.__version__} · {mx.default_device()} · {size} · "
        f"{args.tokens} tokens x {len(PROMPTS)} prompts x {args.repeat} (greedy, interleaved), prompt x {args.prompt_repeat}\n"
    )
    print("\n".join(verdicts) + "\n")
    print(table(runs, list(models)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
