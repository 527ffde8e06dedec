"""Local API benchmark (run by hand): an agent loop against `qwen-desk serve` and `mlx_lm.server`, same model, same run.

    .venv/bin/python bench/api_bench.py [--model PATH] [--rounds 10] [--system-words 1500] > /tmp/api_bench.md
    .venv/bin/python bench/api_bench.py --clients 1,2,4,8 [--tokens 128] [--long 1000] [--repeat 3]   # many at once

The loop is what a coding agent sends: a long system prompt with tools, a user task, then `--rounds` rounds of
the model's tool call and its result (each request resends the whole conversation), then a new user turn.
Both servers run at once (separate processes, greedy, thinking off) and get each request in turn, so both see
the same machine load. Per request: prompt tokens read afresh (prompt - cached, from each server's own usage),
time to first token (client side, streamed), decode tok/s (completion tokens over the time after the first).
Targets: qwen-desk reads afresh no more than mlx_lm.server; its TTFT at request 10 is within 1.2x of request 2.

Without --model it builds the scripted tiny tool model of the tests (every reply is one get_weather call), so the
loop always has a call to answer; with a real model, a reply without a call gets a scripted call appended (the
same for both servers, said in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx2  # noqa: E402
import openai  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class Sample:
    prompt: int
    cached: int
    completion: int
    ttft_s: float
    decode_tps: float

    @property
    def fresh(self) -> int:
        return self.prompt - self.cached


@dataclass
class Target:
    name: str
    url: str
    process: subprocess.Popen
    samples: list[Sample] = field(default_factory=list)
    model: str = ""  # the name sent (mlx_lm.server loads whatever a request names, so: the model's own path)
    messages: list[dict] = field(default_factory=list)
    injected: int = 0  # replies without a call, given a scripted one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(target: Target, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if target.process.poll() is not None:
            raise SystemExit(f"{target.name} exited: {target.process.stderr.read()[-2000:]}")
        try:
            if httpx2.get(f"{target.url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{target.name} did not start within {timeout} s")


def start(model: Path) -> list[Target]:
    qd_port, ml_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    quiet = subprocess.DEVNULL
    qd = subprocess.Popen(
        [sys.executable, "-m", "macapp", "serve", "--model", str(model), "--port", str(qd_port), "--no-think"],
        cwd=ROOT,
        env=env,
        stdout=quiet,
        stderr=subprocess.PIPE,
        text=True,
    )
    ml = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlx_lm.server",
            "--model",
            str(model),
            "--port",
            str(ml_port),
            "--temp",
            "0",
            "--chat-template-args",
            json.dumps({"enable_thinking": False}),
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=quiet,
        stderr=subprocess.PIPE,
        text=True,
    )
    targets = [
        Target("qwen-desk serve", f"http://127.0.0.1:{qd_port}", qd, model=str(model)),
        Target("mlx_lm.server", f"http://127.0.0.1:{ml_port}", ml, model=str(model)),
    ]
    for t in targets:
        wait_ready(t)
    return targets


def ask(target: Target, max_tokens: int) -> dict:
    """One streamed request of the conversation so far; appends a Sample; returns the assistant message."""
    client = openai.OpenAI(base_url=f"{target.url}/v1", api_key="bench", max_retries=0, timeout=600)
    started = time.perf_counter()
    first = last = None
    content, calls, usage = "", {}, None
    stream = client.chat.completions.create(
        model=target.model,
        messages=target.messages,
        tools=TOOLS,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_THINK,
    )
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            if d.content or d.tool_calls or (d.model_extra or {}).get("reasoning_content") or (d.model_extra or {}).get("reasoning"):
                first = first or time.perf_counter()
                last = time.perf_counter()
            content += d.content or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = tc.id or entry["id"]
                if tc.function is not None:
                    entry["name"] = tc.function.name or entry["name"]
                    entry["arguments"] += tc.function.arguments or ""
    cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
    decode_s = (last - first) if first and last and last > first else 0.0
    target.samples.append(
        Sample(
            usage.prompt_tokens,
            cached,
            usage.completion_tokens,
            (first or time.perf_counter()) - started,
            (usage.completion_tokens - 1) / decode_s if decode_s else 0.0,
        )
    )
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
    return message


def decode_tps(target: Target, tokens: int, banned: dict[str, float]) -> float:
    """Decode speed over a long plain reply (eos banned): (tokens - 1) / time from the first to the last piece."""
    client = openai.OpenAI(base_url=f"{target.url}/v1", api_key="bench", max_retries=0, timeout=600)
    first = last = None
    n = 0
    stream = client.chat.completions.create(
        model=target.model,
        messages=[{"role": "user", "content": "Write at length."}],
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
            first = first or time.perf_counter()
            last = time.perf_counter()
    return (n - 1) / (last - first) if first and last and last > first else 0.0


def eos_bias(model: Path) -> dict[str, float]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")} | ({tok.eos_token_id} - {None})
    return {str(i): -100 for i in ids if i is not None}


def system_prompt(words: int, session: int) -> str:
    rules = [
        "Read the files before you change them.",
        "Keep functions small and named for what they do.",
        "Run the tests you touched.",
        "Explain what you changed and why.",
        "Never invent an API: check the source.",
    ]
    return f"Session {session}. You are a coding agent working in a user's repository. " + " ".join(rules[i % len(rules)] for i in range(words // 8))


def run_loop(targets: list[Target], rounds: int, words: int, max_tokens: int, session: int) -> None:
    for t in targets:
        t.messages = [{"role": "system", "content": system_prompt(words, session)}, {"role": "user", "content": "What is the weather in Paris this week?"}]
    for round_ in range(rounds):
        for t in targets:
            message = ask(t, max_tokens)
            if not message.get("tool_calls"):
                t.injected += 1
                message["tool_calls"] = [
                    {"id": f"call_{round_}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}
                ]
            t.messages.append(message)
            for call in message["tool_calls"]:
                t.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"Day {round_ + 1}: sunny, {18 + round_} C."})
    for t in targets:
        t.messages.append({"role": "user", "content": "Thanks. Now summarise the week in one sentence."})
        ask(t, max_tokens)


def median_samples(runs: list[list[Sample]]) -> list[Sample]:
    """Per request, the median over the repeats (each repeat has its own system prompt, so each starts cold)."""
    return [
        Sample(
            int(statistics.median(s.prompt for s in col)),
            int(statistics.median(s.cached for s in col)),
            int(statistics.median(s.completion for s in col)),
            statistics.median(s.ttft_s for s in col),
            0.0,
        )
        for col in zip(*runs)
    ]


def report(
    names: list[str], runs: dict[str, list[list[Sample]]], decode: dict[str, list[float]], injected: dict[str, int], model: str, args: argparse.Namespace
) -> str:
    qd_name, ml_name = names
    qd, ml = median_samples(runs[qd_name]), median_samples(runs[ml_name])
    lines = [
        "## Local API: agent loop, qwen-desk serve vs mlx_lm.server (bench/api_bench.py)",
        "",
        f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs (MLX {'Metal' if sys.platform == 'darwin' else 'CPU'}). "
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d}. Model: {model}. Rounds: {args.rounds}, system prompt ~{args.system_words} words, "
        f"greedy, thinking off; medians of {args.repeat} runs (each with its own system prompt).",
        "",
        "| request | prompt tokens | fresh qwen-desk | fresh mlx_lm | TTFT qwen-desk s | TTFT mlx_lm s |",
        "|---|---|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(zip(qd, ml), 1):
        label = f"{i}" + (" (new user turn)" if i == len(qd) else "")
        lines.append(f"| {label} | {a.prompt} | {a.fresh} | {b.fresh} | {a.ttft_s:.3f} | {b.ttft_s:.3f} |")
    fresh_qd, fresh_ml = sum(s.fresh for s in qd), sum(s.fresh for s in ml)
    dec_qd, dec_ml = statistics.median(decode[qd_name]), statistics.median(decode[ml_name])
    r10 = min(9, len(qd) - 2)
    lines += [
        "",
        f"- tokens read afresh, total: qwen-desk {fresh_qd}, mlx_lm.server {fresh_ml}: ratio {fresh_qd / max(fresh_ml, 1):.2f} (target <= 1)",
        f"- TTFT request 10 / request 2: qwen-desk {qd[r10].ttft_s / max(qd[1].ttft_s, 1e-9):.2f} (target <= 1.2), "
        f"mlx_lm.server {ml[r10].ttft_s / max(ml[1].ttft_s, 1e-9):.2f}",
        f"- TTFT qwen-desk / mlx_lm.server, requests 2-{len(qd) - 1} summed: "
        f"{sum(s.ttft_s for s in qd[1:-1]) / max(sum(s.ttft_s for s in ml[1:-1]), 1e-9):.2f}",
        f"- decode tok/s over {args.decode_tokens}-token replies, median of {len(decode[qd_name])}: qwen-desk {dec_qd:.1f}, "
        f"mlx_lm.server {dec_ml:.1f}: ratio {dec_qd / max(dec_ml, 1e-9):.2f}",
    ]
    for name, count in injected.items():
        if count:
            lines.append(f"- {name}: {count} replies had no tool call; a scripted call was appended to continue the loop")
    return "\n".join(lines) + "\n"


def tiny_tool_model(folder: Path) -> Path:
    from macapp.core.demo.tiny_model import make_tiny_model
    from tests.fixtures.scripted import TOOL_CALL_ANSWER

    return make_tiny_model(folder / "scripted-tool-call", kind="dense", answer=TOOL_CALL_ANSWER, firm=True)


def clients_bench(args: argparse.Namespace, tmp: Path) -> str:
    """`--clients 1,2,4,8`: many streaming clients at once against both servers (bench/concurrency.py)."""
    import concurrency
    from macapp.core.demo.tiny_model import make_tiny_model

    model = Path(args.model) if args.model else make_tiny_model(tmp / "tiny-16-layers", kind="dense", num_layers=16)
    counts = [int(n) for n in args.clients.split(",")]
    targets = start(model)
    try:
        figures = concurrency.run(targets, counts, args.tokens, args.long, args.repeat, eos_bias(model))
    finally:
        for t in targets:
            t.process.terminate()
            t.process.wait(20)
    header = (
        f"Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs (MLX {'Metal' if sys.platform == 'darwin' else 'CPU'}). "
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d}. Model: {args.model or 'tiny random Qwen3.5, dense, 16 layers, hidden 64'}. "
        f"{args.tokens} tokens a client, greedy, thinking off; medians of {args.repeat} interleaved runs."
    )
    return concurrency.report(figures, counts, header)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the scripted tiny tool model, built now)")
    parser.add_argument("--clients", help="e.g. 1,2,4,8: the many-clients benchmark instead of the agent loop")
    parser.add_argument("--tokens", type=int, default=128, help="with --clients: tokens a client")
    parser.add_argument("--long", type=int, default=1000, help="with --clients: the long reply's tokens")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--system-words", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the whole loop (medians are reported)")
    parser.add_argument("--decode-tokens", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="api-bench-") as tmp:
        os.environ.setdefault("QWEN_DESK_HOME", str(Path(tmp) / "home"))
        if args.clients:
            print(clients_bench(args, Path(tmp)))
            return 0
        model = Path(args.model) if args.model else tiny_tool_model(Path(tmp))
        targets = start(model)
        runs: dict[str, list[list[Sample]]] = {t.name: [] for t in targets}
        decode: dict[str, list[float]] = {t.name: [] for t in targets}
        banned = eos_bias(model)
        try:
            for session in range(args.repeat):
                run_loop(targets, args.rounds, args.system_words, args.max_tokens, session)
                for t in targets:
                    runs[t.name].append(t.samples)
                    t.samples = []
                for t in targets:  # alternating, so both see the same load
                    decode[t.name].append(decode_tps(t, args.decode_tokens, banned))
        finally:
            for t in targets:
                t.process.terminate()
                try:
                    t.process.wait(20)
                except subprocess.TimeoutExpired:
                    t.process.kill()
        injected = {t.name: t.injected for t in targets}
        print(report([t.name for t in targets], runs, decode, injected, args.model or "scripted tiny Qwen3.5 tool model (hidden 64, 4 layers)", args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
