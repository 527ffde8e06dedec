"""`qwen-desk chat`: chat with a model in the terminal, or run scripted turns (`--prompt`, `--json`).

    qwen-desk chat --model PATH_OR_REPO [--think | --no-think] [--prompt TEXT]... [--max-tokens N] [--seed N] [--json]

Each --prompt is one user turn of the same conversation, in order. With --json, one JSON object per turn
per line: turn, text, reasoning, prompt_tokens (prefilled this turn), generation_tokens, ttft_s, prompt_tps,
generation_tps, peak_memory_bytes, finish_reason (plus reasoning_tokens, thinking, context_tokens,
conversation_id). Without --prompt it is an interactive chat: tokens stream, reasoning is dimmed, and a
stats line follows each reply. Conversations are saved to the history unless --no-history.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from macapp.cli import UsageError
from macapp.cli.fit import parse_context
from macapp.core.sizing import DEFAULT_PREFILL_STEP

DIM, RESET = "\033[2m", "\033[0m"
HELP = (
    "commands: /think, /nothink (thinking mode), /regen (answer the last message again), "
    "/edit TEXT (replace the last message), /stats, /help, /quit (or Ctrl-D). Ctrl-C stops a reply."
)
LOAD_CODES = ("not_found", "not_a_model", "corrupt", "cancelled")
INPUT_CODES = ("empty_prompt", "context_limit", "memory_budget", "nothing_to_redo")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal, or run scripted turns (--prompt, --json)",
        description="Chat with a local Qwen3.5 model. Each --prompt is one user turn of the same conversation; "
        "without --prompt, an interactive chat.",
    )
    parser.add_argument("--model", "-m", required=True, help="model folder, downloaded hub repo id, or catalog name")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--think", dest="think", action="store_true", default=True, help="reason before answering (default)")
    mode.add_argument("--no-think", dest="think", action="store_false", help="answer directly")
    parser.add_argument("--prompt", "-p", action="append", metavar="TEXT", help="a user turn; repeat for more turns ('-' reads stdin)")
    parser.add_argument("--system", metavar="TEXT", help="system prompt")
    parser.add_argument("--json", action="store_true", help="one JSON object per turn on stdout (needs --prompt)")
    parser.add_argument("--preset", default="general", help="model-card sampling preset: general | precise (thinking) | reasoning (no thinking)")
    parser.add_argument("--max-tokens", type=int, metavar="N", help="most tokens per reply (default: the preset's)")
    parser.add_argument("--seed", type=int, metavar="N", help="random seed, for repeatable sampling")
    parser.add_argument("--temp", type=float, metavar="T", help="temperature (0 = greedy)")
    parser.add_argument("--top-p", type=float, metavar="P")
    parser.add_argument("--top-k", type=int, metavar="K")
    parser.add_argument("--min-p", type=float, metavar="P")
    parser.add_argument("--presence-penalty", type=float, metavar="X")
    parser.add_argument("--thinking-budget", type=int, metavar="N", help="close the reasoning after N tokens and let the model answer")
    parser.add_argument("--context", type=parse_context, metavar="TOKENS", help="context limit, e.g. 32768 or 128k (default: the model's maximum)")
    parser.add_argument("--kv-bits", type=int, choices=(4, 8), help="quantize the KV cache")
    parser.add_argument(
        "--prefill-step-size", type=int, default=DEFAULT_PREFILL_STEP, metavar="N",
        help=f"prompt tokens read per step (default {DEFAULT_PREFILL_STEP})",
    )
    parser.add_argument("--resume", type=int, metavar="ID", help="continue a saved conversation (see `qwen-desk history`)")
    parser.add_argument("--no-history", action="store_true", help="do not save this conversation to the history")
    parser.set_defaults(func=run)


def _sampling(args: argparse.Namespace, thinking: bool):
    from macapp.core.sampling import preset

    try:
        params = preset(
            thinking, args.preset, temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
            presence_penalty=args.presence_penalty, max_tokens=args.max_tokens, seed=args.seed,
        )
        params.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return params


def _turn_record(turn: int, reply: Any, conversation_id: int | None) -> dict[str, Any]:
    st = reply.stats
    return {
        "turn": turn,
        "text": reply.text,
        "reasoning": reply.reasoning,
        "prompt_tokens": st.prompt_tokens,
        "generation_tokens": st.generation_tokens,
        "ttft_s": round(st.ttft_s, 6),
        "prompt_tps": round(st.prompt_tps, 3),
        "generation_tps": round(st.generation_tps, 3),
        "peak_memory_bytes": st.peak_memory_bytes,
        "finish_reason": reply.finish_reason,
        "reasoning_tokens": st.reasoning_tokens,
        "thinking": reply.thinking,
        "budget_hit": reply.budget_hit,
        "context_tokens": st.context_tokens,
        "conversation_id": conversation_id,
    }


def stats_line(reply: Any) -> str:
    """The stats line after a reply (macapp.core.events.format_stats), plus why it ended if not at eos."""
    from macapp.core.events import format_stats

    line = format_stats(reply.stats)
    return line if reply.finish_reason == "stop" else f"{line} · [{reply.finish_reason}]"


class _History:
    """Records turns into the history store as they stream (macapp.core.recorder); a no-op with --no-history.

    The user message is committed before generation starts and the reply at least every second while it
    streams, so a kill mid-reply loses at most about a second of it. The conversation is created by its
    first user message, never empty.
    """

    def __init__(self, enabled: bool, model: str, system: str | None, settings: dict, resume: int | None):
        self.store = None
        self.recorder = None
        self.messages: list[dict] | None = None
        self._resumed: int | None = None
        if not enabled and resume is None:
            return
        from macapp.core.recorder import ChatRecorder
        from macapp.core.history import NotFoundError, Store, StoreError

        try:
            self.store = Store.open()
        except StoreError as exc:
            print(f"qwen-desk: history not saved: {exc}", file=sys.stderr)
            return
        if self.store.notice:
            print(f"qwen-desk: {self.store.notice}", file=sys.stderr)
        if resume is not None:
            try:
                conv = self.store.get_conversation(resume)
            except NotFoundError as exc:
                raise UsageError(f"{exc} See `qwen-desk history list`.") from exc
            self.messages = conv.chat_messages()
            self._resumed = conv.id
        if not enabled or self.store.read_only:
            return
        self.recorder = ChatRecorder(self.store, self._resumed, model=model, system_prompt=system, settings=settings)

    @property
    def conversation_id(self) -> int | None:
        return self.recorder.conversation_id if self.recorder is not None else self._resumed

    def _guard(self, what) -> None:
        if self.recorder is None:
            return
        try:
            what(self.recorder)
        except Exception as exc:  # the chat goes on; say why it is not saved
            print(f"qwen-desk: could not save to the history: {exc}", file=sys.stderr)

    def user(self, text: str, thinking: bool) -> None:
        """Before `session.send`: commit the user message and an empty reply in state 'streaming'."""
        self._guard(lambda r: (r.user(text, thinking=thinking), r.begin_assistant()))

    def regenerate(self, thinking: bool) -> None:
        """Before `session.regenerate`: drop the last reply."""
        self._guard(lambda r: (r.discard_last_reply(), r.conversation_id is not None and r.begin_assistant(thinking)))

    def edit(self, text: str, thinking: bool) -> None:
        """Before `session.edit_last`: replace the last user message (and its reply)."""
        self._guard(lambda r: (r.edit_last_user(text, thinking=thinking), r.begin_assistant()))

    def on_event(self, event: Any) -> None:
        if self.recorder is not None:
            self.recorder.on_event(event)  # never raises; a storage failure is kept in recorder.error

    def settle(self, session: Any) -> None:
        """After a turn that kept no reply (refused, failed, stopped while reading): make the history match
        the session's messages again (e.g. a refused message is taken back, a refused edit puts the old turn back)."""
        rec = self.recorder
        if rec is None or rec.conversation_id is None:
            return

        def sync(r) -> None:
            want = [m for m in session.messages if m["role"] != "system"]
            have = [m for m in self.store.get_conversation(r.conversation_id).messages if m.role != "system"]
            k = 0
            while k < min(len(want), len(have)) and (have[k].role, have[k].content) == (want[k]["role"], want[k].get("content") or ""):
                k += 1
            if k < len(have):
                self.store.truncate(r.conversation_id, have[k].position)
            for m in want[k:]:
                extra = {}
                if m["role"] == "assistant":
                    reason = m.get("finish_reason")
                    extra = dict(reasoning=m.get("reasoning") or "", thinking=bool(m.get("thinking")), finish_reason=reason,
                                 state="stopped" if reason == "stopped" else "complete")
                self.store.add_message(r.conversation_id, m["role"], m.get("content") or "", **extra)
            if not want and r.conversation_id != self._resumed:
                self.store.delete(r.conversation_id)  # its only message was taken back: no empty conversation
                r.conversation_id = None

        self._guard(sync)

    def report(self) -> None:
        """Say (once) if recording failed during the last turn."""
        if self.recorder is not None and self.recorder.error is not None:
            print(f"qwen-desk: could not save to the history: {self.recorder.error}", file=sys.stderr)
            self.recorder.error = None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _stream(job: Any, out: TextIO, color: bool, show: bool, on_event: Any = None) -> Any:
    """Print a job's text as it arrives (reasoning dimmed), passing every event to `on_event` in order;
    return its terminal event. Ctrl-C stops the reply."""
    from macapp.core.events import AnswerDelta, ReasoningDelta

    in_reasoning = wrote = False
    seen = 0
    try:
        for event in job.events():
            if on_event is not None:
                on_event(event)
            seen += 1
            if not show:
                continue
            if isinstance(event, (ReasoningDelta, AnswerDelta)):
                wrote = True
            if isinstance(event, ReasoningDelta):
                if not in_reasoning:
                    out.write(DIM if color else "<think>\n")
                    in_reasoning = True
                out.write(event.text)
                out.flush()
            elif isinstance(event, AnswerDelta):
                if in_reasoning:
                    out.write(RESET + "\n\n" if color else "\n</think>\n\n")
                    in_reasoning = False
                out.write(event.text)
                out.flush()
    except KeyboardInterrupt:
        job.stop()
    last = job.wait()
    if on_event is not None:
        for event in job.history[seen:]:  # what came after Ctrl-C, the terminal event included
            on_event(event)
    if show and wrote:
        if in_reasoning:
            out.write(RESET if color else "\n</think>")
        out.write("\n")
        out.flush()
    return last


def run(args: argparse.Namespace) -> int:
    from macapp.core.engine import Engine, EngineError, SessionOptions

    if args.json and not args.prompt:
        raise UsageError("--json needs at least one --prompt")
    prompts = list(args.prompt or [])
    if "-" in prompts:
        stdin_text = sys.stdin.read()
        prompts = [stdin_text if p == "-" else p for p in prompts]
    for p in prompts:
        if not p.strip():
            raise UsageError("a --prompt is empty: give each turn some text")
    if args.thinking_budget is not None and args.thinking_budget < 0:
        raise UsageError("--thinking-budget must be 0 or more tokens")
    if args.context is not None and args.context < 16:
        raise UsageError("--context must be at least 16 tokens")
    if args.prefill_step_size < 1:
        raise UsageError("--prefill-step-size must be at least 1")
    _sampling(args, args.think)  # refuse bad sampling flags before loading anything

    engine = Engine()
    try:
        try:
            info = engine.load(args.model).result()
        except EngineError as exc:
            if exc.code in LOAD_CODES:
                raise UsageError(exc.message) from exc
            print(f"qwen-desk: {exc.message}", file=sys.stderr)
            return 1
        if not args.json:
            print(f"[{info.name}: loaded in {info.load_time_s:.2f} s, {info.memory_bytes / 1e9:.2f} GB]", file=sys.stderr)
        options = SessionOptions(context_limit=args.context, kv_bits=args.kv_bits, prefill_step_size=args.prefill_step_size)
        settings = {"thinking": args.think, "preset": args.preset, "kv_bits": args.kv_bits, "context": args.context}
        history = _History(not args.no_history, info.name, args.system, settings, args.resume)
        try:
            session = engine.new_session(system_prompt=args.system, messages=history.messages, options=options)
            if prompts:
                return _scripted(args, engine, session, prompts, history)
            return _interactive(args, engine, session, history)
        finally:
            history.close()
    finally:
        engine.close()


def _scripted(args, engine, session, prompts, history) -> int:
    from macapp.core.events import Failed, Finished

    color = sys.stdout.isatty() and not args.json
    for turn, text in enumerate(prompts, 1):
        history.user(text, args.think)
        job = session.send(text, thinking=args.think, sampling=_sampling(args, args.think), thinking_budget=args.thinking_budget)
        last = _stream(job, sys.stdout, color, show=not args.json, on_event=history.on_event)
        history.report()
        if isinstance(last, Failed) or not last.reply.kept:
            history.settle(session)
        if isinstance(last, Failed):
            print(f"qwen-desk: turn {turn}: {last.message}", file=sys.stderr)
            return 2 if last.code in INPUT_CODES else 1
        assert isinstance(last, Finished)
        reply = last.reply
        if args.json:
            print(json.dumps(_turn_record(turn, reply, history.conversation_id)), flush=True)
        else:
            print(stats_line(reply), file=sys.stderr)
    return 0


def _interactive(args, engine, session, history) -> int:
    from macapp.core.events import Failed

    color = sys.stdout.isatty()
    thinking = args.think
    print(f"[thinking {'on' if thinking else 'off'}] {HELP}", file=sys.stderr)
    last_reply = None
    while True:
        try:
            line = input(">> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit", "/q"):
            return 0
        if text == "/help":
            print(HELP, file=sys.stderr)
            continue
        if text in ("/think", "/nothink"):
            thinking = text == "/think"
            print(f"[thinking {'on' if thinking else 'off'}]", file=sys.stderr)
            continue
        if text == "/stats":
            print(stats_line(last_reply) if last_reply else "no reply yet", file=sys.stderr)
            continue
        sampling = _sampling(args, thinking)
        if text == "/regen":
            history.regenerate(thinking)
            job = session.regenerate(thinking=thinking, sampling=sampling, thinking_budget=args.thinking_budget)
        elif text.startswith("/edit "):
            new_text = text[len("/edit ") :].strip()
            history.edit(new_text, thinking)
            job = session.edit_last(new_text, thinking=thinking, sampling=sampling, thinking_budget=args.thinking_budget)
        elif text.startswith("/"):
            print(f"unknown command {text.split()[0]}; {HELP}", file=sys.stderr)
            continue
        else:
            history.user(line, thinking)
            job = session.send(line, thinking=thinking, sampling=sampling, thinking_budget=args.thinking_budget)
        last = _stream(job, sys.stdout, color, show=True, on_event=history.on_event)
        history.report()
        if isinstance(last, Failed) or not last.reply.kept:
            history.settle(session)
        if isinstance(last, Failed):
            print(f"[{last.message}]", file=sys.stderr)
            continue
        reply = last.reply
        last_reply = reply
        print(stats_line(reply) if reply.kept else "[stopped before the reply began; nothing kept]", file=sys.stderr)
