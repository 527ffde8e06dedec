"""Vision benchmark (run by hand): should text-only chats stay on mlx-lm, and what do pictures cost?

    .venv/bin/python bench/vision_bench.py [--quick] > /tmp/vision_bench.md

1. Text-only decode and prefill tok/s, mlx-lm's own Qwen3.5 model versus mlx-vlm's language model (driven
   through the same `mlx_lm.stream_generate` by `PositionedLM`, explicit mRoPE positions), same weights,
   same prompt, greedy, `<|im_end|>` banned so both make exactly N tokens; runs alternate, medians compared.
   Two models: the test model (hidden 64) and a small one (hidden 512, 8 layers, dense).
2. One picture per size: image tokens, encode time (processor + tower), time to first token.
3. A follow-up question about the same picture: tokens read and TTFT on the kept cache, versus reading the
   whole conversation afresh (picture encoded again).
4. Memory: what attaching the tower adds (active memory) versus the tower's bytes; mlx-vlm's import time.

Prints a Markdown section (machine, date, figures) for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from PIL import Image  # noqa: E402

from macapp.core.vision.images import image_from_bytes  # noqa: E402
from macapp.core.vision.runner import attach_vision  # noqa: E402
from macapp.core.demo.tiny_vlm import make_tiny_vlm  # noqa: E402


def _picture(size, max_pixels):
    buffer = io.BytesIO()
    Image.effect_mandelbrot(size, (-2, -1, 1, 1), 40).convert("RGB").save(buffer, "PNG")
    return image_from_bytes(buffer.getvalue(), f"{size[0]}x{size[1]}.png", max_pixels)


def _run(model, tokenizer, prompt, tokens, cache, embeddings=None, bias=None):
    """(prompt tok/s, decode tok/s, TTFT s) of one mlx-lm stream_generate run."""
    from mlx_lm.sample_utils import make_logits_processors

    processors = make_logits_processors(logit_bias=bias) if bias else None
    start = time.perf_counter()
    first = None
    last = None
    kwargs = {"input_embeddings": embeddings} if embeddings is not None else {}
    for last in mlx_lm.stream_generate(model, tokenizer, mx.array(prompt), max_tokens=tokens, prompt_cache=cache, logits_processors=processors, **kwargs):
        if first is None:
            first = time.perf_counter() - start
    return last.prompt_tps, last.generation_tps, first


def text_paths(path: Path, tokens: int, reps: int) -> dict:
    model, tokenizer = mlx_lm.load(str(path))
    vision = attach_vision(model, path)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "tell me about the local model and its memory " * 20}], add_generation_prompt=True, enable_thinking=False
    )
    rows = {"mlx-lm": [], "mlx-vlm": []}
    for _ in range(reps):
        rows["mlx-lm"].append(_run(model, tokenizer, prompt, tokens, mlx_lm.models.cache.make_prompt_cache(model), bias={im_end: -1e9}))
        vision.lm.bind([])
        rows["mlx-vlm"].append(_run(vision.lm, tokenizer, prompt, tokens, vision.lm.make_cache(), bias={im_end: -1e9}))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()}
    return {"prompt": len(prompt), "median": med}


def _picture_turn(vision, tokenizer, image):
    """(templated text, EncodedTurn, a fresh cache with the turn queued) for one question about `image`."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}],
        add_generation_prompt=True,
        enable_thinking=False,
        tokenize=False,
    )
    turn = vision.encode(tokenizer.encode(text, add_special_tokens=False), [image])
    cache = vision.lm.make_cache()
    vision.lm.bind([])
    vision.lm.queue(turn, cache)
    return text, turn, cache


def picture_turns(path: Path, sizes) -> tuple[list, dict]:
    model, tokenizer = mlx_lm.load(str(path))
    before = mx.get_active_memory()
    vision = attach_vision(model, path)
    grew = mx.get_active_memory() - before
    rows = []
    for size in sizes:
        image = _picture(size, vision.limits.max_pixels)
        text, turn, cache = _picture_turn(vision, tokenizer, image)
        _, _, first = _run(vision.lm, tokenizer, turn.tokens, 8, cache, embeddings=turn.embeddings)
        rows.append((size, image.size, turn.image_tokens, len(turn.tokens), turn.encode_s, turn.encode_s + first))
    # follow-up on the kept cache vs afresh
    image = _picture(sizes[-1], vision.limits.max_pixels)
    text, turn, cache = _picture_turn(vision, tokenizer, image)
    reply = [
        r.token
        for r in mlx_lm.stream_generate(vision.lm, tokenizer, mx.array(turn.tokens), max_tokens=16, prompt_cache=cache, input_embeddings=turn.embeddings)
    ]
    follow = tokenizer.encode("\n", add_special_tokens=False) + tokenizer.apply_chat_template(
        [{"role": "user", "content": "And what colour is it mostly?"}], add_generation_prompt=True, enable_thinking=False
    )
    start = time.perf_counter()
    _run(vision.lm, tokenizer, follow, 1, cache)
    kept = time.perf_counter() - start
    start = time.perf_counter()
    full_text = text + tokenizer.decode(reply) + "\n" + tokenizer.decode(follow)
    again = vision.encode(tokenizer.encode(full_text, add_special_tokens=False), [image])
    fresh_cache = vision.lm.make_cache()
    vision.lm.bind([])
    vision.lm.queue(again, fresh_cache)
    _run(vision.lm, tokenizer, again.tokens, 1, fresh_cache, embeddings=again.embeddings)
    fresh = time.perf_counter() - start
    return rows, {"kept_tokens": len(follow), "kept_s": kept, "fresh_tokens": len(again.tokens), "fresh_s": fresh, "grew": grew, "tower": vision.vision_bytes}


def import_time() -> float:
    code = "import time; t = time.perf_counter(); import mlx_vlm.models.qwen3_5, mlx_vlm.utils; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 3 if args.quick else 5
    tokens = 64 if args.quick else 128
    print(f"## Vision ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} {platform.system()}, mlx {mx.__version__}, CPU)\n")
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "test model (hidden 64, 4 layers)": make_tiny_vlm(Path(tmp) / "t64"),
            "small model (hidden 512, 8 layers)": make_tiny_vlm(Path(tmp) / "t512", hidden_size=512, num_layers=8),
        }
        print(f"### Text-only: mlx-lm's model vs mlx-vlm's language model, same mlx-lm loop ({tokens} tokens, {reps} alternating runs, medians)\n")
        print("| model | prompt tokens | prefill tok/s mlx-lm | prefill tok/s mlx-vlm | ratio | decode tok/s mlx-lm | decode tok/s mlx-vlm | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for name, path in models.items():
            r = text_paths(path, tokens, reps)
            (lp, ld), (vp, vd) = r["median"]["mlx-lm"], r["median"]["mlx-vlm"]
            print(f"| {name} | {r['prompt']} | {lp:.0f} | {vp:.0f} | {vp / lp:.2f} | {ld:.1f} | {vd:.1f} | {vd / ld:.2f} |")
        for name, path in models.items():
            rows, follow = picture_turns(path, [(64, 64), (256, 192), (1024, 1024), (4000, 3000)])
            print(f"\n### One picture, {name} (processor max {256 * 256:,} pixels)\n")
            print("| picture | decoded at | image tokens | prompt tokens | encode ms | TTFT ms (encode + prefill + 1st token) |")
            print("|---|---|---|---|---|---|")
            for size, used, image_tokens, prompt, encode, ttft in rows:
                print(f"| {size[0]}x{size[1]} | {used[0]}x{used[1]} | {image_tokens} | {prompt} | {encode * 1000:.1f} | {ttft * 1000:.1f} |")
            print(
                f"\n- Follow-up about the same picture: {follow['kept_tokens']} tokens read in {follow['kept_s'] * 1000:.1f} ms on the kept cache; "
                f"afresh (picture encoded again, {follow['fresh_tokens']} tokens) {follow['fresh_s'] * 1000:.1f} ms "
                f"({follow['fresh_s'] / follow['kept_s']:.1f}x)."
            )
            print(
                f"- Attaching the tower added {follow['grew'] / 1e6:.2f} MB of active memory; the tower's weights are {follow['tower'] / 1e6:.2f} MB (text weights shared, not copied)."
            )
    print(f"\n- `import mlx_vlm.models.qwen3_5, mlx_vlm.utils` in a fresh process: {import_time():.2f} s (paid on the first picture only).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
