"""Memory under load (run by hand): 300 mixed requests from 4 workers against one server; does its RSS stay bounded?

    .venv/bin/python bench/api_memory.py [--requests 300] [--workers 4] [--pool-mb 64]

The server runs in this process (LocalServer over a ServingEngine whose checkpoint pool is `--pool-mb`), on a
tiny random 16-layer Qwen3.5; the clients are real HTTP clients on other threads. Requests mix what agents send:
conversations that grow (each worker an agent loop of its own system prompt), one-off questions, streamed and
plain replies, and clients that hang up mid-stream. RSS is sampled every 25 requests; the report gives the
baseline after warm-up, the peak, the end and the pool's own bytes, so growth beyond the pool shows as a leak.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402
import psutil  # noqa: E402


def request_body(worker: int, i: int, history: list[dict]) -> tuple[dict, bool]:
    kind = i % 4
    if kind == 0:  # a one-off question, plain
        return {"messages": [{"role": "user", "content": f"Question {worker}-{i}"}], "max_tokens": 24, "temperature": 0}, False
    history.append({"role": "user", "content": f"Step {i}: " + "details " * (i % 7)})
    body = {"messages": [{"role": "system", "content": f"Agent {worker}. " + "Rules. " * 200}, *history], "max_tokens": 32, "temperature": 0}
    return {**body, "stream": True}, kind == 3  # every fourth hangs up early


def worker(url: str, worker_id: int, count: int, done: list[int], lock: threading.Lock, samples: list, proc) -> None:
    history: list[dict] = []
    with httpx2.Client(timeout=120) as client:
        for i in range(count):
            body, hang_up = request_body(worker_id, i, history)
            if body.get("stream"):
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                    for n, _line in enumerate(response.iter_lines()):
                        if hang_up and n > 3:
                            break
                history.append({"role": "assistant", "content": "ok"})
            else:
                client.post(f"{url}/v1/chat/completions", json=body)
            if len(history) > 40:
                history[:] = history[-10:]
            with lock:
                done[0] += 1
                if done[0] % 25 == 0:
                    samples.append((done[0], proc.memory_info().rss))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--pool-mb", type=int, default=64)
    args = parser.parse_args()
    from macapp.core.engine import Engine
    from macapp.core.demo.tiny_model import make_tiny_model
    from macapp.server.config import ServerConfig
    from macapp.server.engine_backend import serving_backend
    from macapp.server.local_server import LocalServer

    proc = psutil.Process()
    with tempfile.TemporaryDirectory(prefix="api-memory-") as tmp:
        os.environ.setdefault("QWEN_DESK_HOME", str(Path(tmp) / "home"))
        model = make_tiny_model(Path(tmp) / "tiny-16", kind="dense", num_layers=16)
        engine = Engine()
        engine.load(str(model)).result(120)
        backend = serving_backend(engine, pool_bytes=args.pool_mb * 1024**2)
        server = LocalServer(backend, ServerConfig(port=0))
        url = server.start()
        try:
            httpx2.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "warm"}], "max_tokens": 8}, timeout=120)
            baseline = proc.memory_info().rss
            done, lock, samples = [0], threading.Lock(), []
            per = args.requests // args.workers
            with ThreadPoolExecutor(args.workers) as pool:
                for f in [pool.submit(worker, url, w, per, done, lock, samples, proc) for w in range(args.workers)]:
                    f.result()
            end = proc.memory_info().rss
            pool_bytes, evicted = backend.pool.nbytes, backend.pool.evicted
        finally:
            server.stop()
            backend.close()
            engine.close()
    peak = max(rss for _, rss in samples)
    mb = lambda b: f"{b / 1024**2:.0f} MB"  # noqa: E731
    print("## Local API: memory under 300 mixed requests (bench/api_memory.py)\n")
    print(
        f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. Date: {datetime.now(timezone.utc):%Y-%m-%d}. "
        f"Tiny random Qwen3.5, dense, 16 layers; {done[0]} requests from {args.workers} workers; checkpoint pool {args.pool_mb} MB.\n"
    )
    print("| requests | RSS |\n|---|---|")
    for n, rss in samples:
        print(f"| {n} | {mb(rss)} |")
    print(
        f"\n- baseline after warm-up {mb(baseline)}, peak {mb(peak)}, end {mb(end)}: growth {mb(peak - baseline)} "
        f"against a pool of {args.pool_mb} MB (holding {mb(pool_bytes)} at the end, {evicted} checkpoints evicted)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
