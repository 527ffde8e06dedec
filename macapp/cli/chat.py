"""`qwen-desk chat`: chat with a model in the terminal, or run scripted turns (`--prompt`, `--json`).

    qwen-desk chat --model PATH_OR_REPO [--think | --no-think] [--prompt TEXT]... [--image PATH]... [--video PATH [--video-fps F] [--video-max-frames N]] [--max-tokens N] [--seed N] [--json]
                   [--mcp-config FILE] [--allow-tool SERVER/TOOL]... [--mcp-timeout SECONDS]

Each --prompt is one user turn of the same conversation, in order. With --json, one JSON object per turn
per line: turn, text, reasoning, prompt_tokens (prefilled this turn), generation_tokens, ttft_s, prompt_tps,
generation_tps, peak_memory_bytes, finish_reason, image_tokens (plus reasoning_tokens, thinking, context_tokens,
conversation_id, video_frames, tool_calls: the MCP tool calls, docs/tools.md). --image and --video attach pictures to the first turn (`/image PATH` to the next message, interactively). Without --prompt it is an interactive chat: tokens stream, reasoning is dimmed, and a
stats line follows each reply. Conversations are saved to the history unless --no-history.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from macapp.cli import Subparsers, UsageError
from macapp.cli.cache import add_disk_argument, disk_bytes, open_store
from macapp.cli.chat_tools import add_tool_arguments, json_calls, show_call, tool_loop
from macapp.cli.cluster import add_run_arguments, engine_for, launch_or_follow
from macapp.cli.model import add_cache_arguments, add_model_argument, add_mtp_argument, check_cache_arguments, load_model, mtp_mode, mtp_notice
from macapp.core import events as ev
from macapp.core.conversation import ConversationModel, Turn
from macapp.core.engine import ChatSession, Engine, SessionOptions
from macapp.core.engine.messages import ChatMessage
from macapp.core.events import AnswerDelta, Failed, Finished, ReasoningDelta, Reply, TerminalEvent, ToolCallDone, ToolCallRecord, TurnKind, format_stats
from macapp.core.fit.estimate import DEFAULT_PREFILL_STEP
from macapp.core.history import NotFoundError, Store, StoreError
from macapp.core.jsonvalue import JSONObject
from macapp.core.recorder import ChatRecorder, run_on
from macapp.core.sampling import SamplingParams, preset
from macapp.core.tools.loop import ToolLoop
from macapp.core.vision.images import ImageError, PreparedImage, open_image
from macapp.core.vision.pictures import FILES
from macapp.core.vision.video import PreparedVideo
from macapp.cli.video import open_video_argument, video_arguments

DIM, RESET = "\033[2m", "\033[0m"
HELP = (
    "commands: /think, /nothink (thinking mode), /regen (answer the last message again), "
    "/edit TEXT (replace the last message), /image PATH (attach a picture to the next message), /stats, /help, "
    "/quit (or Ctrl-D). Ctrl-C stops a reply."
)
# A turn that fails for one of these is the user's to fix (exit 2); anything else exits 1.
INPUT_CODES = (ev.EMPTY_PROMPT, ev.CONTEXT_LIMIT, ev.MEMORY_BUDGET, ev.NOTHING_TO_REDO, ev.BAD_IMAGE, ev.TEXT_ONLY)


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal, or run scripted turns (--prompt, --json)",
        description="Chat with a local Qwen3.5 model. Each --prompt is one user turn of the same conversation; without --prompt, an interactive chat.",
    )
    add_model_argument(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--think", dest="think", action="store_true", default=True, help="reason before answering (default)")
    mode.add_argument("--no-think", dest="think", action="store_false", help="answer directly")
    parser.add_argument("--prompt", "-p", action="append", metavar="TEXT", help="a user turn; repeat for more turns ('-' reads stdin)")
    parser.add_argument("--system", metavar="TEXT", help="system prompt")
    parser.add_argument("--image", action="append", metavar="PATH", help="attach a picture to the first turn; repeat for more")
    parser.add_argument("--video", metavar="PATH", help="attach a video to the first turn (frames sampled as mlx-vlm samples them)")
    parser.add_argument("--video-fps", type=float, metavar="F", help="frames sampled per second of --video (default: the model's, 2)")
    parser.add_argument("--video-max-frames", type=int, metavar="N", help="at most N frames of --video (default: the model's)")
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
    add_cache_arguments(parser)
    add_mtp_argument(parser)
    parser.add_argument(
        "--prefill-step-size",
        type=int,
        default=DEFAULT_PREFILL_STEP,
        metavar="N",
        help=f"prompt tokens read per step (default {DEFAULT_PREFILL_STEP})",
    )
    parser.add_argument("--resume", type=int, metavar="ID", help="continue a saved conversation (see `qwen-desk history`)")
    add_disk_argument(parser, "a conversation continued with --resume")
    parser.add_argument("--no-history", action="store_true", help="do not save this conversation to the history")
    add_tool_arguments(parser)
    add_run_arguments(parser)
    parser.set_defaults(func=run)


def _sampling(args: argparse.Namespace, thinking: bool) -> SamplingParams:
    try:
        params = preset(
            thinking,
            args.preset,
            temperature=args.temp,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            presence_penalty=args.presence_penalty,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        params.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return params


def _turn_record(turn: int, reply: Reply, conversation_id: int | None, tool_calls: list[ToolCallRecord], video_frames: int = 0) -> dict[str, object]:
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
        "image_tokens": st.image_tokens,
        "video_frames": video_frames,
        "mtp_steps": st.mtp_steps,
        "mtp_acceptance": round(st.mtp_acceptance, 4),
        "mtp_tokens_per_step": round(st.mtp_tokens_per_step, 4),
        "tool_calls": json_calls(tool_calls),
    }


def stats_line(reply: Reply) -> str:
    """The stats line after a reply (macapp.core.events.format_stats), plus why it ended if not at eos."""
    line = format_stats(reply.stats)
    return line if reply.finish_reason == "stop" else f"{line} · [{reply.finish_reason}]"


class History:
    """The chat's history: the store and the one recorder (macapp.core.recorder); records nothing with
    --no-history or a read-only history. A storage failure is said on stderr and the chat goes on."""

    def __init__(self, enabled: bool, model: str, system: str | None, settings: JSONObject, resume: int | None):
        self.store = None
        self.recorder = None
        self.messages: list[ChatMessage] | None = None  # a resumed conversation, for the session to read once
        self._resumed: int | None = None
        if not enabled and resume is None:
            return
        try:
            self.store = Store.open(pictures=FILES)
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

    def report(self) -> None:
        """Say (once) if recording failed during the last turn."""
        if self.recorder is not None and self.recorder.error is not None:
            print(f"qwen-desk: could not save to the history: {self.recorder.error}", file=sys.stderr)
            self.recorder.error = None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


class Chat:
    """The command line's conversation (macapp.core.conversation, the window's too): its engine session, and the
    history that records every turn of it. Here only the printing; the model runs and records the turns."""

    def __init__(
        self,
        engine: Engine,
        session: ChatSession,
        history: History,
        system: str | None = None,
        options: SessionOptions | None = None,
        tools: ToolLoop | None = None,
    ) -> None:
        self.engine = engine
        self.history = history
        self.system = system
        self.options = options  # the session's SessionOptions, for a session re-opened from the history
        self.tool_calls: list[ToolCallRecord] = []  # the last turn's MCP tool calls
        runner = tools.run if tools is not None else run_on
        self.conversation = ConversationModel(self._new_session, history.recorder, system_prompt=system, session=session, system_wins=True, run_turn=runner)

    @property
    def session(self) -> ChatSession | None:
        return self.conversation.session

    def _new_session(self, system: str | None, messages: list[ChatMessage] | None) -> ChatSession:
        return self.engine.new_session(system_prompt=system, messages=messages, options=self.options)

    def turn(
        self,
        kind: TurnKind,
        text: str,
        thinking: bool,
        sampling: SamplingParams,
        budget: int | None,
        out: TextIO,
        color: bool = False,
        show: bool = True,
        images: tuple[PreparedImage, ...] = (),
    ) -> TerminalEvent:
        """Run one turn (TurnKind), printing its text as it streams (when `show`) and recording it; return
        its terminal event. `images`: pictures (vision.images.PreparedImage) for a send."""
        turn = self.conversation.start(kind, text, thinking=thinking, sampling=sampling, thinking_budget=budget, images=images)
        self.tool_calls = []
        last = _stream(turn, out, color, show, self.tool_calls)
        self.history.report()
        self.conversation.ensure_session()  # e.g. a failed reply's text is kept in the history: the next turn sees it too
        return last


def _stream(turn: Turn, out: TextIO, color: bool, show: bool, tool_calls: list[ToolCallRecord]) -> TerminalEvent:
    """Print a turn's text as it arrives (reasoning dimmed), and its tool calls on stderr; return its terminal event
    (`tool_calls` gets the calls). Ctrl-C stops the reply."""
    in_reasoning = wrote = False
    try:
        for event in turn.events():
            if isinstance(event, ToolCallDone):
                tool_calls.append(event.record)
                if show:
                    show_call(event.record, sys.stderr)
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
        turn.stop()
    last = turn.wait()  # recorded, the terminal event included (after Ctrl-C too)
    if show and wrote:
        if in_reasoning:
            out.write(RESET if color else "\n</think>")
        out.write("\n")
        out.flush()
    return last


def run(args: argparse.Namespace) -> int:
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
    check_cache_arguments(args)
    disk_bytes(args)
    if args.prefill_step_size < 1:
        raise UsageError("--prefill-step-size must be at least 1")
    _sampling(args, args.think)  # refuse bad sampling flags before loading anything
    images = _pictures(args.image or [])  # every picture checked before loading anything
    video_settings = video_arguments(args)
    tools = tool_loop(args, interactive=not prompts)  # the MCP config checked too; its servers start at the first turn
    if (code := launch_or_follow(args, prompts, reads_input=not prompts)) is not None:
        return code  # --hostfile: this process started and watched the ranks (or it was a follower rank)
    engine = engine_for()
    disk = open_store(args, engine)
    try:
        info = load_model(engine, args.model, context=args.context, mtp=mtp_mode(args))
        if info is None:
            return 1
        if not args.json:
            print(f"[{info.name}: loaded in {info.load_time_s:.2f} s, {info.memory_bytes / 1e9:.2f} GB]", file=sys.stderr)
        if (notice := mtp_notice(info, args.mtp)) is not None:
            print(notice, file=sys.stderr)
        options = SessionOptions(context_limit=args.context, kv_bits=args.kv_bits, prefill_step_size=args.prefill_step_size, mtp=mtp_mode(args))
        if args.video:
            images += (open_video_argument(engine, args.video, video_settings, args.context),)
        settings = {"thinking": args.think, "preset": args.preset, "kv_bits": args.kv_bits, "context": args.context}
        history = History(not args.no_history, info.name, args.system, settings, args.resume)
        try:
            session = engine.new_session(system_prompt=args.system, messages=history.messages, options=options)
            chat = Chat(engine, session, history, args.system, options, tools)
            if prompts:
                return _scripted(args, chat, prompts, images)
            return _interactive(args, chat, images)
        finally:
            history.close()
    finally:
        engine.close()
        disk.close()  # the checkpoints queued for writing go to disk before the process ends
        if tools is not None:
            tools.host.close()  # every server, its processes included


def _pictures(paths: list[str]) -> tuple[PreparedImage, ...]:
    """--image / /image files read and checked now; UsageError naming a bad one."""
    try:
        return tuple(open_image(path) for path in paths)
    except ImageError as exc:
        raise UsageError(str(exc)) from None


def _scripted(args: argparse.Namespace, chat: Chat, prompts: list[str], images: tuple[PreparedImage, ...] = ()) -> int:
    color = sys.stdout.isatty() and not args.json
    for turn, text in enumerate(prompts, 1):
        sampling = _sampling(args, args.think)
        attached = images if turn == 1 else ()
        last = chat.turn(TurnKind.SEND, text, args.think, sampling, args.thinking_budget, sys.stdout, color, show=not args.json, images=attached)
        if isinstance(last, Failed):
            print(f"qwen-desk: turn {turn}: {last.message}", file=sys.stderr)
            return 2 if last.code in INPUT_CODES else 1
        assert isinstance(last, Finished)
        reply = last.reply
        if args.json:
            frames = sum(image.frames for image in attached if isinstance(image, PreparedVideo))
            print(json.dumps(_turn_record(turn, reply, chat.history.conversation_id, chat.tool_calls, frames)), flush=True)
        else:
            print(stats_line(reply), file=sys.stderr)
    return 0


def _interactive(args: argparse.Namespace, chat: Chat, images: tuple[PreparedImage, ...] = ()) -> int:
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
        if text.startswith("/image"):
            images = _attach(images, text[len("/image") :].strip())
            continue
        if text == "/regen":
            kind, text = TurnKind.REGENERATE, ""
        elif text.startswith("/edit "):
            kind, text = TurnKind.EDIT, text[len("/edit ") :].strip()
        elif text.startswith("/"):
            print(f"unknown command {text.split()[0]}; {HELP}", file=sys.stderr)
            continue
        else:
            kind, text = TurnKind.SEND, line
        attached = images if kind is TurnKind.SEND else ()
        last = chat.turn(kind, text, thinking, _sampling(args, thinking), args.thinking_budget, sys.stdout, color, images=attached)
        images = () if attached else images  # sent with the message, or refused with it (attach again to retry)
        if isinstance(last, Failed):
            print(f"[{last.message}]", file=sys.stderr)
            continue
        assert isinstance(last, Finished)
        reply = last.reply
        last_reply = reply
        print(stats_line(reply) if reply.kept else "[stopped before the reply began; nothing kept]", file=sys.stderr)


def _attach(images: tuple[PreparedImage, ...], path: str) -> tuple[PreparedImage, ...]:
    """`/image PATH`: one more picture for the next message (a bad one is said, and nothing else changes)."""
    if not path:
        print("[usage: /image PATH]", file=sys.stderr)
        return images
    try:
        (picture,) = _pictures([path])
    except UsageError as exc:
        print(f"[{exc}]", file=sys.stderr)
        return images
    notes = f"; {'; '.join(picture.notes)}" if picture.notes else ""
    print(f"[{picture.name} ({picture.size[0]}x{picture.size[1]}{notes}) goes with your next message]", file=sys.stderr)
    return images + (picture,)
