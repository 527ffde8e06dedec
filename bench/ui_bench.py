"""The UI's cost while streaming: event-loop stall and tok/s through the whole UI path vs raw mlx-lm.

    python bench/ui_bench.py [--model PATH] [--tokens 400] [--runs 3]

Without --model it builds the tiny random-weights test model (MLX on the CPU here; on a Mac pass a real MLX
Qwen3.5 folder). The same greedy decode (end tokens biased away so every run makes exactly --tokens tokens)
runs through:
  raw   mlx_lm.load + stream_generate on one long-lived thread of their own, nothing else running;
  app   the real window: ChatView -> Engine worker -> events -> EventBridge (throttled) -> Markdown repaint,
        with a 5 ms QTimer measuring how late the event loop serves it (p50/p99/max lateness);
  engine   the app's engine with no window (its worker thread and events, nobody repainting);
  app, unthrottled   the same with the bridge's interval at 0 (a repaint per event loop pass), for contrast.
Generation tok/s excludes the time to first token: (tokens - 1) / wall time from the first to the last token,
timed on the generating thread the same way for all (the engine's own figure is printed too).
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

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, enable_thinking=False)
    last = None
    first_t = 0.0
    for last in stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=tokens,
        sampler=make_sampler(temp=0.0),
        logits_processors=make_logits_processors(logit_bias=bias),
    ):
        if not first_t:
            first_t = time.perf_counter()
    last_t = time.perf_counter()
    assert last.generation_tokens == tokens, last.generation_tokens
    return (tokens - 1) / (last_t - first_t)


class RawWorker:
    """mlx-lm alone on one long-lived thread that loads and generates (as the engine does), nothing else added."""

    def __init__(self, path: Path, bias: dict[int, float]) -> None:
        import queue
        import threading

        self.requests: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.bias = bias
        self.path = path
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        from mlx_lm import load

        model, tokenizer = load(str(self.path))
        while True:
            tokens = self.requests.get()
            self.results.put(raw_run(model, tokenizer, self.bias, tokens))

    def run(self, tokens: int) -> float:
        self.requests.put(tokens)
        return self.results.get()


class TokenClock:
    """A job listener on the engine's worker thread: when the first and the last text arrived (wall clock)."""

    def __init__(self) -> None:
        self.first = self.last = 0.0

    def __call__(self, event) -> None:
        from macapp.core.events import AnswerDelta, ReasoningDelta

        if isinstance(event, (AnswerDelta, ReasoningDelta)):
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now

    def tps(self, tokens: int) -> float:
        return (tokens - 1) / (self.last - self.first)


def engine_run(engine, bias, tokens: int) -> float:
    """The engine with no window: the same worker thread and events, nobody repainting."""
    from macapp.core.sampling import greedy

    session = engine.new_session()
    job = session.send(PROMPT, thinking=False, sampling=greedy(max_tokens=tokens, logit_bias=bias))
    clock = TokenClock()
    job.add_listener(clock)
    reply = job.result()
    assert reply.stats.generation_tokens == tokens, reply.stats.generation_tokens
    return clock.tps(tokens)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def app_run(app, window, bias, tokens: int, interval_ms: int, probe: bool = True) -> dict:
    from PySide6.QtCore import QElapsedTimer, QEventLoop, Qt, QTimer

    chat = window.chat
    chat.controller.repaint_interval_ms = interval_ms
    chat.new_chat()
    chat.composer.thinking.setChecked(False)
    chat.controller.sampling_overrides = {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "max_tokens": tokens,
        "logit_bias": bias,
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
    chat.messages.renders = 0
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    if probe:  # the 5 ms probe costs the GUI thread something itself: tok/s is taken from runs without it
        timer.start()
    chat.send(PROMPT)
    clock_t = TokenClock()
    chat.controller.job.add_listener(clock_t)
    # The real event loop (it sleeps in select() between events, as the app does), until the reply ends.
    loop = QEventLoop()
    watch = QTimer()
    watch.setInterval(20)
    watch.timeout.connect(lambda: None if chat.busy else loop.quit())
    watch.start()
    loop.exec()
    watch.stop()
    timer.stop()
    gui_cpu = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
    reply = chat.messages.widgets()[-1]
    stats = reply.stats
    assert stats.generation_tokens == tokens, stats.generation_tokens
    return {
        "tps": clock_t.tps(tokens),
        "engine_tps": stats.generation_tps,
        "p50": pct(lateness, 0.50) if lateness else 0.0,
        "p99": pct(lateness, 0.99) if lateness else 0.0,
        "max": max(lateness, default=0.0),
        "renders": chat.messages.renders,
        "gui_cpu": gui_cpu,
        "ticks": len(lateness),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="an MLX Qwen3.5 folder (default: the tiny test model)")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="qwen-desk-ui-bench-"))
    os.environ["QWEN_DESK_HOME"] = str(work / "home")
    if args.model is None:
        from macapp.core.demo.tiny_model import make_tiny_model

        args.model = make_tiny_model(work / "tiny-qwen3.5-moe", kind="moe")
        label = "tiny test model (random weights)"
    else:
        label = args.model.name
    bias = end_token_bias(args.model)

    import mlx.core as mx

    raw_worker = RawWorker(args.model, bias)
    raw_worker.run(32)  # warm up

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
    while window.chat.controller.model_ref is None:
        app.processEvents()
        time.sleep(0.01)
    app_run(app, window, bias, 32, 33)  # warm up

    engine = window.chat.controller.engine
    raw, eng, thr, unthr, thr_probe, unthr_probe = [], [], [], [], [], []
    for _ in range(args.runs):
        raw.append(raw_worker.run(args.tokens))
        eng.append(engine_run(engine, bias, args.tokens))
        thr.append(app_run(app, window, bias, args.tokens, 33, probe=False))
        unthr.append(app_run(app, window, bias, args.tokens, 0, probe=False))
        thr_probe.append(app_run(app, window, bias, args.tokens, 33))
        unthr_probe.append(app_run(app, window, bias, args.tokens, 0))
    window.close()

    raw_tps = statistics.median(raw)
    eng_tps = statistics.median(eng)

    def summary(runs: list[dict]) -> dict:
        return {k: statistics.median(r[k] for r in runs) for k in ("tps", "engine_tps", "p50", "p99", "max", "renders", "gui_cpu")}

    t, u = summary(thr), summary(unthr)
    for mine, probed in ((t, summary(thr_probe)), (u, summary(unthr_probe))):
        mine.update({k: probed[k] for k in ("p50", "p99", "max")})
    device = "Metal GPU" if mx.metal.is_available() else "CPU"
    lines = [
        f"ui bench — {platform.system()} {platform.machine()} ({device}) — {date.today()} — {label}, {args.tokens} tokens x {args.runs} runs (medians)",
        "tok/s = (tokens - 1) / wall time from first to last token, timed on the generating thread",
        f"raw mlx_lm.stream_generate          {raw_tps:8.1f} tok/s",
        f"engine, no window                   {eng_tps:8.1f} tok/s  ratio {eng_tps / raw_tps:.3f}",
        f"app, throttled bridge (33 ms)       {t['tps']:8.1f} tok/s  ratio {t['tps'] / raw_tps:.3f} "
        f"(vs engine {t['tps'] / eng_tps:.3f})  "
        f"loop lateness p50 {t['p50']:.2f} / p99 {t['p99']:.2f} / max {t['max']:.2f} ms  repaints {t['renders']:.0f}  "
        f"GUI thread CPU {100 * t['gui_cpu']:.1f}%",
        f"app, unthrottled (repaint per pass) {u['tps']:8.1f} tok/s  ratio {u['tps'] / raw_tps:.3f} "
        f"(vs engine {u['tps'] / eng_tps:.3f})  "
        f"loop lateness p50 {u['p50']:.2f} / p99 {u['p99']:.2f} / max {u['max']:.2f} ms  repaints {u['renders']:.0f}  "
        f"GUI thread CPU {100 * u['gui_cpu']:.1f}%",
        f"targets: p99 <= 16 ms -> {'met' if t['p99'] <= 16 else 'NOT met'}; app >= 0.99 x raw -> {'met' if t['tps'] >= 0.99 * raw_tps else 'NOT met'}",
    ]
    spread = lambda xs: f"{min(xs):.0f}–{max(xs):.0f}"  # noqa: E731
    lines.append(
        f"spread over runs (tok/s): raw {spread(raw)}, engine {spread(eng)}, app {spread([r['tps'] for r in thr])}, "
        f"unthrottled {spread([r['tps'] for r in unthr])}"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
