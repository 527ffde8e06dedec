"""The UI's cost while streaming: event-loop stall and tok/s through the whole UI path vs raw mlx-lm.

    python bench/ui_bench.py [--model PATH] [--tokens 400] [--runs 3]

Without --model it builds the tiny random-weights test model (MLX on the CPU here; on a Mac pass a real MLX
Qwen3.5 folder). The same greedy decode (end tokens biased away so every run makes exactly --tokens tokens)
runs through:
  raw   mlx_lm.stream_generate on this thread, nothing else running;
  app   the real window: ChatView -> Engine worker -> events -> EventBridge (throttled) -> Markdown repaint,
        with a 5 ms QTimer measuring how late the event loop serves it (p50/p99/max lateness);
  app, unthrottled   the same with the bridge's interval at 0 (a repaint per event loop pass), for contrast.
Generation tok/s excludes the time to first token in all three (mlx-lm's and the engine's own figure).
Targets: p99 lateness <= 16 ms, app tok/s >= 0.99 x raw.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Tell me everything you know about the answer."


def end_token_bias(path: Path) -> dict[int, float]:
    import json

    cfg = json.loads((path / "generation_config.json").read_text()) if (path / "generation_config.json").exists() else {}
    eos = cfg.get("eos_token_id", [])
    eos = eos if isinstance(eos, list) else [eos]
    return {int(t): -1e4 for t in eos}


def raw_run(model, tokenizer, bias, tokens: int) -> float:
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, enable_thinking=False
    )
    last = None
    for last in stream_generate(
        model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(temp=0.0),
        logits_processors=make_logits_processors(logit_bias=bias),
    ):
        pass
    assert last.generation_tokens == tokens, last.generation_tokens
    return last.generation_tps


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def app_run(app, window, bias, tokens: int, interval_ms: int) -> dict:
    from PySide6.QtCore import QElapsedTimer, Qt, QTimer

    chat = window.chat
    chat.repaint_interval_ms = interval_ms
    chat.new_chat()
    chat.composer.thinking.setChecked(False)
    chat.sampling_overrides = {
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
        "max_tokens": tokens, "logit_bias": bias,
    }
    lateness: list[float] = []
    clock = QElapsedTimer()
    clock.start()
    last = [clock.nsecsElapsed()]

    def tick():
        now = clock.nsecsElapsed()
        lateness.append(max(0.0, (now - last[0]) / 1e6 - 5.0))
        last[0] = now

    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.setInterval(5)
    timer.timeout.connect(tick)
    chat.renders = 0
    timer.start()
    chat.send(PROMPT)
    while chat.busy:
        app.processEvents()
        time.sleep(0.0005)  # hand the GIL over, like an idle event loop blocked in select()
    timer.stop()
    reply = chat._message_widgets()[-1]
    stats = reply.stats
    assert stats.generation_tokens == tokens, stats.generation_tokens
    return {
        "tps": stats.generation_tps,
        "p50": pct(lateness, 0.50),
        "p99": pct(lateness, 0.99),
        "max": max(lateness),
        "renders": chat.renders,
        "ticks": len(lateness),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="an MLX Qwen3.5 folder (default: the tiny test model)")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="qwen-desk-ui-bench-"))
    os.environ["QWEN_DESK_HOME"] = str(work / "home")
    if args.model is None:
        from macapp.devtools.tiny_model import make_tiny_model

        args.model = make_tiny_model(work / "tiny-qwen3.5-moe", kind="moe")
        label = "tiny test model (random weights)"
    else:
        label = args.model.name
    bias = end_token_bias(args.model)

    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(args.model))
    raw_run(model, tokenizer, bias, 32)  # warm up

    from macapp.core.catalog import model_from_folder
    from macapp.core.settings import Settings
    from macapp.ui.app import make_application
    from macapp.ui.main_window import MainWindow

    app = make_application()
    window = MainWindow(Settings())
    window.show()
    ref = model_from_folder(args.model.resolve())
    from dataclasses import replace

    window.chat.load_model(replace(ref, local_path=args.model.resolve()))
    while window.chat.model_ref is None:
        app.processEvents()
        time.sleep(0.01)
    app_run(app, window, bias, 32, 33)  # warm up

    raw, thr, unthr = [], [], []
    for _ in range(args.runs):
        raw.append(raw_run(model, tokenizer, bias, args.tokens))
        thr.append(app_run(app, window, bias, args.tokens, 33))
        unthr.append(app_run(app, window, bias, args.tokens, 0))
    window.close()

    raw_tps = statistics.median(raw)

    def summary(runs: list[dict]) -> dict:
        return {k: statistics.median(r[k] for r in runs) for k in ("tps", "p50", "p99", "max", "renders")}

    t, u = summary(thr), summary(unthr)
    device = "Metal GPU" if mx.metal.is_available() else "CPU"
    lines = [
        f"ui bench — {platform.system()} {platform.machine()} ({device}) — {date.today()} — {label}, "
        f"{args.tokens} tokens x {args.runs} runs (medians)",
        f"raw mlx_lm.stream_generate          {raw_tps:8.1f} tok/s",
        f"app, throttled bridge (33 ms)       {t['tps']:8.1f} tok/s  ratio {t['tps'] / raw_tps:.3f}  "
        f"loop lateness p50 {t['p50']:.2f} / p99 {t['p99']:.2f} / max {t['max']:.2f} ms  repaints {t['renders']:.0f}",
        f"app, unthrottled (repaint per pass) {u['tps']:8.1f} tok/s  ratio {u['tps'] / raw_tps:.3f}  "
        f"loop lateness p50 {u['p50']:.2f} / p99 {u['p99']:.2f} / max {u['max']:.2f} ms  repaints {u['renders']:.0f}",
        f"targets: p99 <= 16 ms -> {'met' if t['p99'] <= 16 else 'NOT met'}; "
        f"app >= 0.99 x raw -> {'met' if t['tps'] >= 0.99 * raw_tps else 'NOT met'}",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
