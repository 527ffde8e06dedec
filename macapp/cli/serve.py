"""`qwen-desk serve`: serve the model to other tools over a local OpenAI- and Anthropic-compatible API.

    qwen-desk serve --model MODEL [--host 127.0.0.1] [--port N] [--api-key KEY] [--context N] [--kv-bits 4|8]
                    [--think | --no-think] [--allow-origin ORIGIN]... [--allow-host NAME]... [--prompt-cache-disk SIZE]

The key can come from QWEN_DESK_API_KEY instead of --api-key (a flag shows in the process list; the variable does not).
--think / --no-think set what the OpenAI APIs do for a request that does not say; the Anthropic API follows
Anthropic's own default (no thinking unless the request's `thinking` asks).

Loads the model on the engine's worker thread, then prints one line with the base URL once it answers.
SIGINT / SIGTERM stop it: replies in flight end with an error saying the server shut down (never as a finished
answer), requests still queued or arriving get 503 with Retry-After, then the process exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from macapp.cli import Subparsers, UsageError
from macapp.cli.cache import add_disk_argument, disk_bytes, open_store
from macapp.cli.cluster import add_run_arguments, engine_for, launch_or_follow
from macapp.cli.model import add_cache_arguments, add_model_argument, add_mtp_argument, check_cache_arguments, load_model, mtp_mode, mtp_notice
from macapp.server.activity import RequestRecord, RequestState
from macapp.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, is_loopback


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model to other tools (OpenAI- and Anthropic-compatible local API)",
        description="Serve a local Qwen3.5 model over an OpenAI-compatible (/v1/chat/completions) and "
        "Anthropic-compatible (/v1/messages) API, for agents such as Claude Code and OpenAI-client tools.",
    )
    add_model_argument(parser)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this Mac only)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port (default {DEFAULT_PORT}, clear of Ollama 11434, LM Studio 1234, llama.cpp/mlx-lm 8080)",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every request. Other users of this Mac can "
        "see a flag in the process list (ps); set the QWEN_DESK_API_KEY environment variable instead to keep it private",
    )
    add_cache_arguments(parser)
    add_mtp_argument(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--think",
        dest="think",
        action="store_true",
        default=True,
        help="OpenAI APIs (/v1/chat/completions, /v1/responses): reason before answering when a request does not say "
        "(default). The Anthropic API (/v1/messages) thinks only when a request asks (its `thinking` field), as "
        "Anthropic's own API does, with either flag",
    )
    mode.add_argument(
        "--no-think",
        dest="think",
        action="store_false",
        help="OpenAI APIs: answer directly when a request does not say (enable_thinking, reasoning_effort, reasoning.effort)",
    )
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN", help="let web pages from ORIGIN use the server (CORS); repeatable")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header names NAME (a proxy, a DNS name); repeatable. Loopback names are "
        "always answered and, with --host beyond loopback, this Mac's own names and addresses (NAME.local too); "
        "other names are refused against DNS rebinding. '*' turns the check off",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="answer at most N requests at once (default: as many as fit beside the model at --context, up to 32; "
        "more wait in a queue). With --hostfile requests are answered one at a time",
    )
    add_disk_argument(parser, "a new agent session, and the server after a restart,")
    add_run_arguments(parser)
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace) -> ServerConfig:
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel must be 1 or more, not {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 (any free port) and 65535, not {args.port}")
    check_cache_arguments(args)
    disk_bytes(args)
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key is empty: give a key, or leave the flag out")
    key = args.api_key or os.environ.get("QWEN_DESK_API_KEY") or None
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=key,
        allowed_origins=tuple(args.allow_origin),
        allowed_hosts=tuple(args.allow_host),
        default_thinking=args.think,
    )


def request_line(record: RequestRecord) -> str:
    """One stderr line per finished request: who, tokens in / reused / out, decode speed, how it ended; for a
    refused one, its status and reason."""
    if record.state is RequestState.REFUSED:
        return f"qwen-desk: {record.client}: refused {record.status}: {record.error}"
    speed = f" at {record.tokens_per_s:.1f} tok/s" if record.tokens_per_s else ""
    if record.mtp_tokens_per_step is not None and record.mtp_acceptance is not None:
        speed += f" (MTP {record.mtp_tokens_per_step:.2f} tokens/step, {record.mtp_acceptance:.0%} of drafts kept)"
    end = record.state.value + (f": {record.error}" if record.error else "")
    reused = f"{record.cached_tokens} reused" + (f" from {record.cached_from}" if record.cached_tokens and record.cached_from else "")
    return f"qwen-desk: {record.client}: {record.prompt_tokens} tokens in ({reused}), {record.completion_tokens} out{speed} - {end}"


def _log_finished(record: RequestRecord) -> None:
    if record.state.finished:
        print(request_line(record), file=sys.stderr, flush=True)


def ready_line(model: str, url: str, config: ServerConfig, parallel: int | None = None) -> str:
    """The one line printed when the server answers (a network-facing bind says so in it); `parallel`: how many
    requests it answers at once (1 on several Macs)."""
    line = f"qwen-desk: serving {model} at {url} (OpenAI base URL {url}/v1; Anthropic base URL {url})"
    if parallel is not None:
        line += " - one request at a time" if parallel == 1 else f" - up to {parallel} requests at once"
    line += " - Ctrl-C stops"
    if not is_loopback(config.host):
        guard = "requests need the API key" if config.api_key else "anyone on it can use the model: add --api-key KEY"
        line += f" - WARNING: listening on {config.host}, the model is reachable from the network; {guard}"
    return line


class _Signals:
    """SIGINT / SIGTERM while serving: the first one asks for a clean stop; repeats during it are ignored."""

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._got = threading.Event()
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def __enter__(self) -> "_Signals":
        for s in (signal.SIGINT, signal.SIGTERM):
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        self.caught.append(signum)
        self._got.set()

    def wait(self) -> int:
        while not self._got.wait(0.2):  # a timeout, so the main thread keeps running Python signal handlers
            pass
        return self.caught[0]


def run(args: argparse.Namespace) -> int:
    # why: both load MLX (and the HTTP stack) on import, and `qwen-desk --help` imports every subcommand's module
    from macapp.server.engine_backend import serving_backend
    from macapp.server.local_server import LocalServer

    config = _config(args)
    if (code := launch_or_follow(args)) is not None:
        return code  # --hostfile: this process started and watched the ranks (or it was a follower rank)
    engine = engine_for()
    disk = open_store(args, engine)  # the chat sessions of this engine would share it
    try:
        info = load_model(engine, args.model, context=args.context, mtp=mtp_mode(args))
        if info is None:
            return 1
        if (notice := mtp_notice(info, args.mtp)) is not None:
            print(notice, file=sys.stderr)
        backend = serving_backend(
            engine,
            context=args.context,
            kv_bits=args.kv_bits,
            queue_limit=config.queue_limit,
            parallel=args.parallel,
            mtp=mtp_mode(args),
            disk=disk,
        )
        server = LocalServer(backend, config)
        server.activity.add_observer(_log_finished)
        try:
            url = server.start()
        except OSError as exc:
            print(f"qwen-desk: {exc}", file=sys.stderr)
            return 1
        with _Signals() as signals:
            print(ready_line(info.name, url, config, backend.batch_limit), flush=True)
            try:
                signum = signals.wait()
                print(f"qwen-desk: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
            finally:
                server.stop()
                backend.close()
        return 0
    finally:
        engine.close()
        disk.close()  # the checkpoints queued for writing go to disk before the process ends
