"""What the engine's worker thread reports: plain dataclasses, cheap to make (one per token at most).

A chat job yields PromptProgress while the prompt is read, then ReasoningDelta / AnswerDelta text pieces
with a StatsUpdate a few times a second, and ends with exactly one Finished (even when stopped) or Failed.
A load job ends with Loaded or Failed. Text deltas carry a `text` field, so consumers may coalesce them
with `dataclasses.replace(last, text=last.text + new.text)`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Mapping

from macapp.core.jsonvalue import JSONObject

# Failure codes (Failed.code): bad input is refused before any work; "error" is anything unexpected.
NOT_FOUND = "not_found"  # no such folder, or a repo that is not downloaded
NOT_A_MODEL = "not_a_model"  # not a Qwen3.5-family MLX model folder
CORRUPT = "corrupt"  # config/weights/tokenizer present but unreadable or inconsistent
NO_MODEL = "no_model"  # chat before a model is loaded
EMPTY_PROMPT = "empty_prompt"
CONTEXT_LIMIT = "context_limit"  # the prompt would not fit the context limit
MEMORY_BUDGET = "memory_budget"  # the prompt's KV cache would not fit the memory budget
NOTHING_TO_REDO = "nothing_to_redo"  # regenerate/edit on a conversation with no user message
BAD_IMAGE = "bad_image"  # a picture that is missing, not an image, damaged or too large to read
TEXT_ONLY = "text_only"  # pictures given to a build without a vision tower
CANCELLED = "cancelled"  # a load stopped before it began
ERROR = "error"


class Event:
    """Marker base: what a job reports (engine/jobs.py, event_stream.py); the front ends dispatch on the subclasses."""

    __slots__ = ()


class TerminalEvent(Event):
    """Marker base: the last event of a job (a job emits exactly one, and nothing after it)."""

    __slots__ = ()


@dataclass
class GenerationStats:
    """Per-reply figures. Times in seconds; rates in tokens per second; memory in bytes."""

    ttft_s: float = 0.0  # request start (template + prefill) to the first generated token
    prompt_tokens: int = 0  # tokens actually prefilled for this reply (not the cached conversation)
    prompt_tps: float = 0.0  # prompt_tokens / prefill time
    generation_tokens: int = 0  # tokens sampled by the model (the final eos included, like mlx-lm)
    generation_tps: float = 0.0  # (generation_tokens - 1) / time from the first token to the last
    reasoning_tokens: int = 0  # of generation_tokens, spent inside the reasoning (closing tag included)
    forced_tokens: int = 0  # tokens the engine fed itself (the thinking budget's "</think>")
    peak_memory_bytes: int = 0  # MLX peak memory during this reply
    context_tokens: int = 0  # tokens in the session's cache now (the whole conversation so far)
    elapsed_s: float = 0.0  # request start to now / to the end
    finish_reason: str | None = None  # None while running; see Reply.finish_reason
    image_tokens: int = 0  # of prompt_tokens, the pictures' tokens (the tower's encoding time is in ttft_s)
    # Speculative decoding with the MTP head (macapp.core.engine.mtp_decode); all 0 when it did not run:
    mtp_steps: int = 0  # verify passes
    mtp_drafted: int = 0  # drafted tokens the acceptance walk looked at
    mtp_accepted: int = 0  # of those, kept
    mtp_acceptance: float = 0.0  # mtp_accepted / mtp_drafted
    mtp_tokens_per_step: float = 0.0  # tokens each verify pass gave (kept drafts + the model's own)
    mtp_passes: int = 0  # the main model's forward passes for the reply (plain decoding: one per token)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def format_stats(stats: object) -> str:
    """One line like mlx_lm.chat's, e.g. 'prompt 120 tokens at 410.0 tok/s · generation 412 tokens at 38.2 tok/s ·
    30 reasoning · first token 0.31 s · peak 2.10 GB · context 532'. Takes a GenerationStats or any object with
    those field names (the history's ReplyStats); figures that are None or absent are left out."""

    def get(name: str) -> float | None:
        value = getattr(stats, name, None)
        return value if isinstance(value, (int, float)) else None

    parts = []
    for label, tokens, tps in (("prompt", get("prompt_tokens"), get("prompt_tps")), ("generation", get("generation_tokens"), get("generation_tps"))):
        if tokens is not None:
            parts.append(f"{label} {tokens} tokens" + (f" at {tps:.1f} tok/s" if tps is not None else ""))
    if get("image_tokens"):
        parts.append(f"{get('image_tokens')} image")  # of the prompt tokens: the pictures'
    if get("reasoning_tokens"):
        parts.append(f"{get('reasoning_tokens')} reasoning")
    if get("ttft_s") is not None:
        parts.append(f"first token {get('ttft_s'):.2f} s")
    peak = get("peak_memory_bytes")
    if peak is not None:
        parts.append(f"peak {peak / 1e9:.2f} GB")
    if get("context_tokens") is not None:
        parts.append(f"context {get('context_tokens')}")
    if get("mtp_steps"):
        parts.append(f"MTP {get('mtp_acceptance'):.0%} accepted, {get('mtp_tokens_per_step'):.2f} tokens/step")
    return " · ".join(parts)


@dataclass
class Reply:
    """One assistant reply as the session keeps it."""

    text: str = ""  # the answer, without reasoning or tags
    reasoning: str = ""  # the reasoning, without tags ("" when thinking is off)
    thinking: bool = False
    finish_reason: str = "stop"  # "stop" (eos) | "length" (max_tokens) | "stopped" (Job.stop) | "context" (limit reached)
    stats: GenerationStats = field(default_factory=GenerationStats)
    kept: bool = True  # False when stopped while the prompt was still being read: the turn was rolled back
    budget_hit: bool = False  # the thinking budget closed the reasoning
    token_ids: list[int] = field(default_factory=list)  # the sampled tokens (the budget's forced ones are not included)
    # A chat turn's tokens after its generation prompt as the session's cache holds them (a budget-0 prompt's
    # closing tag, then every sampled and forced token): what a reopened conversation reads again (engine.turns.replay).
    cache_tokens: list[int] = field(default_factory=list)


@dataclass
class PromptProgress(Event):
    processed: int
    total: int


@dataclass
class ReasoningDelta(Event):
    text: str


@dataclass
class AnswerDelta(Event):
    text: str


@dataclass
class StatsUpdate(Event):
    stats: GenerationStats


@dataclass
class ToolCallAsked(Event):
    """The model called a tool (macapp.core.tools.loop); the call is being approved, then run."""

    call_id: str
    server: str
    name: str  # the server's name for the tool
    arguments: dict[str, object]


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call as the chat keeps it: what was asked, whether it was allowed, what came back."""

    server: str
    name: str
    arguments: dict[str, object]
    allowed: bool
    result: str | None  # the result's text as the model read it (cut, special tokens defused); None when denied
    is_error: bool = False
    timed_out: bool = False
    elapsed_s: float = 0.0
    call_id: str = ""
    round: int = 0  # the turn's round that made the call, from 1 (0: not known, a record from before rounds)
    at: int = 0  # where in the reply's answer text the call was made (its length then): text and calls in order
    said: str = ""  # the round's own text as the model wrote it, call markup included: a reopened chat reads it again

    def to_json(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> "ToolCallRecord":
        args = data.get("arguments")
        elapsed = data.get("elapsed_s")
        result = data.get("result")
        return cls(
            server=str(data.get("server", "")),
            name=str(data.get("name", "")),
            arguments=dict(args) if isinstance(args, dict) else {},
            allowed=bool(data.get("allowed")),
            result=None if result is None else str(result),
            is_error=bool(data.get("is_error")),
            timed_out=bool(data.get("timed_out")),
            elapsed_s=float(elapsed) if isinstance(elapsed, (int, float)) else 0.0,
            call_id=str(data.get("call_id", "")),
            round=_int(data.get("round")),
            at=_int(data.get("at")),
            said=str(data.get("said") or ""),
        )


@dataclass
class ToolCallDone(Event):
    """A tool call ended: run (its result), denied, timed out or failed."""

    record: ToolCallRecord


@dataclass
class Finished(TerminalEvent):
    reply: Reply


@dataclass
class Failed(TerminalEvent):
    message: str  # one clear, actionable sentence
    code: str = ERROR


@dataclass
class Loaded(TerminalEvent):
    path: str
    name: str
    model_type: str
    load_time_s: float
    memory_bytes: int  # MLX active memory after loading (the weights as they sit in memory)
    weights_bytes: int  # bytes of the model's parameters
    bits: int | None  # weight quantization (None: unquantized)
    max_context: int  # the longest context as loaded: its native length, or the YaRN limit in long-context mode
    has_thinking: bool
    native_context: int | None = None  # the model's own max_position_embeddings
    yarn_factor: float | None = None  # long-context mode (macapp.core.long_context.notice says it)
    mtp_head_bytes: int = 0  # the build's MTP head as loaded (0: none usable; speculative decoding is off)


@dataclass
class Unloaded(TerminalEvent):
    memory_bytes: int


class TurnKind(enum.Enum):
    """What a chat turn does to the conversation: the session, the recorder and every front end share it."""

    SEND = "send"  # a new user message and its reply
    REGENERATE = "regenerate"  # the last reply again, the user message kept
    EDIT = "edit"  # the last user message replaced, then a new reply
