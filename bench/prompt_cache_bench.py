"""Prompt cache on disk (run by hand): first-token time for an agent preamble cold, from memory, from disk; and
disk bytes per token for every catalog build.

    .venv/bin/python bench/prompt_cache_bench.py [--tokens 40000] [--model PATH] [--skip-measure]

Measured on this machine (the tiny MoE Qwen3.5 of the real architecture unless --model): Claude Code's recorded
first request (tests/fixtures/claude_code/first_request.json), cut to about --tokens prompt tokens by dropping
tools from its end, is one agent session's first request. Through the API's serving core (ServingEngine):
- cold: a server with nothing kept reads it whole;
- from memory: the same server, a second session's first request (other user words after the same system
  prompt, tools and system-reminder block: Claude Code's shape), reads only the user's words;
- from disk: a restarted server (a new ServingEngine and a new DiskStore, nothing in memory) answers the second
  session's request from the first session's checkpoints on disk (a copy of the folder as session 1 left it).
Each is the request's time to first token (Completed.ttft_s), the three in one run; the replies are compared.

Then, for every catalog build (from the catalog configs: resources/catalog.json): the KV bytes one token
adds on disk (the full-attention layers, bf16), the DeltaNet state one checkpoint adds, the disk bytes of a
--tokens preamble with a checkpoint every 4,096 tokens and a few at its block boundaries, the fit's estimate of
reading it cold on an M4 Pro (48 GB), and a restore's read (the preamble's KV and one state) at an assumed SSD
speed (--ssd-gbps).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORDED = ROOT / "tests" / "fixtures" / "claude_code" / "first_request.json"
TIMEOUT = 3600


def _request(body: dict, words: str):
    from macapp.server.anthropic_api import parse_messages_request

    body = copy.deepcopy(body)
    body["messages"][0]["content"][-1]["text"] = words
    body["max_tokens"] = 8
    body["stream"] = False
    body["thinking"] = {"type": "disabled"}
    request = parse_messages_request(body).request
    from dataclasses import replace

    from macapp.core.sampling import greedy

    return replace(request, sampling=greedy(8))


def _preamble(tokens: int, tokenizer) -> dict:
    """The recorded body with tools dropped from its end until its prompt is at most `tokens` long."""
    from macapp.core.serving.render import render

    body = json.loads(RECORDED.read_text())["body"]
    while len(render(tokenizer, _request(body, "say hi")).tokens) > tokens and body["tools"]:
        body["tools"] = body["tools"][: max(0, len(body["tools"]) - 2)]
    return body


def measure(model: Path, tokens: int) -> dict:
    from macapp.core.engine import Engine
    from macapp.core.prompt_disk import DiskStore
    from macapp.core.serving.requests import Completed
    from macapp.core.serving.runner import ServingEngine, ServingOptions

    engine = Engine()
    folder = Path(tempfile.mkdtemp(prefix="prompt-cache-bench-"))
    try:
        engine.load(str(model)).result(timeout=TIMEOUT)
        body = _preamble(tokens, engine.model.tokenizer)
        first, second = _request(body, "say hi"), _request(body, "list the files in this folder")

        def run(serving: ServingEngine, request) -> Completed:
            done = serving.submit(request).wait(TIMEOUT)
            assert isinstance(done, Completed), done
            if serving.options.disk is not None:
                serving.options.disk.flush()
            return done

        server = ServingEngine(engine, ServingOptions(disk=DiskStore(folder / "live", 10**12, 0)))
        cold = run(server, first)
        shutil.copytree(folder / "live", folder / "after-session-1")  # the disk as session 1 left it
        disk_bytes = sum(p.stat().st_size for p in (folder / "after-session-1").glob("*/*.safetensors"))
        memory = run(server, second)
        restarted = ServingEngine(engine, ServingOptions(disk=DiskStore(folder / "after-session-1", 10**12, 0)))
        disk = run(restarted, second)
        return {
            "prompt": cold.usage.prompt_tokens,
            "cold": cold,
            "memory": memory,
            "disk": disk,
            "disk_bytes": disk_bytes,
            "same": memory.text == disk.text,
        }
    finally:
        engine.close()
        shutil.rmtree(folder, ignore_errors=True)


def catalog_table(tokens: int, ssd_gbps: float) -> list[str]:
    from macapp.core.catalog import ModelRef, builtin_catalog
    from macapp.core.fit import estimate
    from macapp.core.hardware import GiB, what_if_machine

    machine = what_if_machine("M4 Pro", 48 * GiB)
    checkpoints = tokens // 4096 + 6  # the periodic ones, and a few at message and block boundaries
    lines = [
        f"| build | KV bytes/token | DeltaNet state per checkpoint | {tokens:,}-token preamble on disk | cold read (fit, M4 Pro 48 GB) | restore from disk at {ssd_gbps:g} GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for entry in builtin_catalog():
        for bits, build in sorted(entry.builds.items()):
            per_token = estimate.kv_bytes_per_token(entry.arch)
            state = estimate.state_bytes(entry.arch)
            total = per_token * tokens + state * checkpoints
            read = per_token * tokens + state  # a restore reads its chain's KV and its own state only
            ref = ModelRef(entry.name, entry.arch, bits, build.group_size, build.repo, weights_bytes=build.weights_bytes)
            cold = estimate.prefill_estimate(ref, machine, tokens)
            cold_s = f"{cold.seconds:.0f} s" if cold is not None else "-"
            lines.append(
                f"| {entry.name} {bits}-bit | {per_token / 1024:.0f} KiB | {state / 2**20:.1f} MiB | {total / 1e9:.2f} GB | {cold_s} | {read / (ssd_gbps * 1e9):.2f} s |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=40_000)
    parser.add_argument("--model", type=Path, help="a model folder (default: the tiny MoE, built in a temporary folder)")
    parser.add_argument("--ssd-gbps", type=float, default=5.0, help="SSD read speed assumed for the catalog table (GB/s)")
    parser.add_argument("--skip-measure", action="store_true", help="only the catalog table")
    args = parser.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## Prompt cache on disk (bench/prompt_cache_bench.py) — {stamp}, {platform.machine()} {platform.system()}")
    if not args.skip_measure:
        import mlx.core as mx

        model = args.model
        if model is None:
            from macapp.core.demo.tiny_model import make_tiny_model

            model = make_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-")) / "tiny-qwen3.5-moe", "moe")
        got = measure(model, args.tokens)
        print(f"\nMeasured on this machine ({model.name}, MLX {mx.__version__}, {mx.default_device()}): a {got['prompt']:,}-token agent preamble")
        print("(Claude Code's recorded first request), a second session's first request with other user words.\n")
        print("| first request | tokens reused | first token |")
        print("|---|---|---|")
        for name, label in (("cold", "session 1, cold"), ("memory", "session 2, from memory"), ("disk", "session 2 after a restart, from disk")):
            done = got[name]
            print(f"| {label} | {done.usage.cached_tokens:,} of {done.usage.prompt_tokens:,} | {done.ttft_s:.2f} s |")
        cold_s, disk_s = got["cold"].ttft_s, got["disk"].ttft_s
        print(f"\nFrom disk: {cold_s / disk_s:.1f}x faster than cold; {got['disk_bytes'] / 1e6:.1f} MB on disk; same reply as from memory: {got['same']}.")
    print(f"\nEvery catalog build, from its config (a {args.tokens:,}-token preamble):\n")
    print("\n".join(catalog_table(args.tokens, args.ssd_gbps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
