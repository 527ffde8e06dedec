"""Many clients at once (run by hand, through `bench/api_bench.py --clients 1,2,4,8`): qwen-desk serve vs mlx_lm.server.

For each client count N, N streaming clients each ask for a `--tokens`-token plain reply (end-of-turn tokens
banned, greedy, thinking off) at the same moment; aggregate tok/s is all their completion tokens over the wall
time from the first request sent to the last token received, and scaling is that over the 1-client figure of
the same server. TTFT median/max are per client. Then the short request during a long reply: a `--long`-token
reply streams, and once its first token is in, a 10-token request is sent; its TTFT is what an agent's side
call (a title, a memory, a sub-agent) waits for. Runs are interleaved, server by server, and repeated
(`--repeat`): each figure is the median over the repeats.

Targets on the CPU VM (issue #18): scaling at 4 and 8 clients at least mlx_lm.server's in the same run; the short
request's TTFT within 2x of mlx_lm.server's; one client's decode no slower than before batching (>= 0.97x).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class Round:
    tps: float  # aggregate completion tok/s
    ttfts: list[float]


@dataclass
class Figures:
    rounds: dict[int, list[Round]] = field(default_factory=dict)  # clients -> one Round per repeat
    short_ttft: list[float] = field(default_factory=list)

    def tps(self, clients: int) -> float:
        return statistics.median(r.tps for r in self.rounds[clients])

    def ttft(self, clients: int, pick) -> float:
        return statistics.median(pick(r.ttfts) for r in self.rounds[clients])


def _stream(url: str, model: str, content: str, tokens: int, banned: dict[str, float], first_token: threading.Event | None = None):
    """(seconds to the first token, completion tokens, time of the last token) of one streamed reply."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=900)
    sent = time.perf_counter()
    first = last = None
    n = 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=tokens,
        temperature=0,
        logit_bias=banned,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_THINK,
    )
    for chunk in stream:
        n = chunk.usage.completion_tokens if chunk.usage else n
        if any(c.delta.content for c in chunk.choices):
            now = time.perf_counter()
            if first is None:
                first = now
                if first_token is not None:
                    first_token.set()
            last = now
    return (first or time.perf_counter()) - sent, n, last or time.perf_counter()


def clients_round(url: str, model: str, clients: int, tokens: int, banned: dict[str, float]) -> Round:
    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        futures = [pool.submit(_stream, url, model, f"Client {i}: write at length.", tokens, banned) for i in range(clients)]
        results = [f.result() for f in futures]
    end = max(last for _, _, last in results)
    return Round(sum(n for _, n, _ in results) / (end - start), [ttft for ttft, _, _ in results])


def short_during_long(url: str, model: str, long_tokens: int, banned: dict[str, float]) -> float:
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_stream, url, model, "Write a very long story.", long_tokens, banned, started)
        started.wait(600)
        ttft, _, _ = _stream(url, model, "Say hi.", 10, banned)
        long.result()
    return ttft


def run(targets: list, counts: list[int], tokens: int, long_tokens: int, repeat: int, banned: dict[str, float]) -> dict[str, Figures]:
    figures = {t.name: Figures() for t in targets}
    for t in targets:  # warm both up (first-call compilation, caches)
        clients_round(t.url, t.model, 1, 16, banned)
    for _ in range(repeat):
        for n in counts:
            for t in targets:
                figures[t.name].rounds.setdefault(n, []).append(clients_round(t.url, t.model, n, tokens, banned))
        for t in targets:
            figures[t.name].short_ttft.append(short_during_long(t.url, t.model, long_tokens, banned))
    return figures


def report(figures: dict[str, Figures], counts: list[int], header: str) -> str:
    (qd_name, qd), (ml_name, ml) = figures.items()
    lines = [
        "## Local API: many clients at once, qwen-desk serve vs mlx_lm.server (bench/api_bench.py --clients)",
        "",
        header,
        "",
        "| clients | qwen-desk tok/s | scaling | mlx_lm tok/s | scaling | TTFT median qd / ml s | TTFT max qd / ml s |",
        "|---|---|---|---|---|---|---|",
    ]
    one_qd, one_ml = qd.tps(counts[0]), ml.tps(counts[0])
    for n in counts:
        lines.append(
            f"| {n} | {qd.tps(n):.1f} | {qd.tps(n) / one_qd:.2f}x | {ml.tps(n):.1f} | {ml.tps(n) / one_ml:.2f}x | "
            f"{qd.ttft(n, statistics.median):.2f} / {ml.ttft(n, statistics.median):.2f} | {qd.ttft(n, max):.2f} / {ml.ttft(n, max):.2f} |"
        )
    short_qd, short_ml = statistics.median(qd.short_ttft), statistics.median(ml.short_ttft)
    lines += [
        "",
        f"- a 10-token request sent while a long reply streams, TTFT: {qd_name} {short_qd:.2f} s, {ml_name} {short_ml:.2f} s: "
        f"ratio {short_qd / max(short_ml, 1e-9):.2f} (target <= 2)",
        f"- one client: {qd_name} {one_qd:.1f} tok/s, {ml_name} {one_ml:.1f} tok/s: ratio {one_qd / max(one_ml, 1e-9):.2f}",
    ]
    for n in counts:
        if n >= 4:
            lines.append(f"- scaling at {n} clients: {qd_name} {qd.tps(n) / one_qd:.2f}x vs {ml_name} {ml.tps(n) / one_ml:.2f}x (target: at least mlx_lm's)")
    return "\n".join(lines) + "\n"
