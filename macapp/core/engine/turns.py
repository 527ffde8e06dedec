"""How a turn is planned: which cache point to go back to, which tokens to feed, what a stop while reading undoes.

A session's cache is only ever appended to. A send feeds the previous reply's closing text and the new user
turn (or the whole conversation through the template when nothing is cached). A regenerate goes back to just
before the prompt's last token and feeds that one token again (or, in another thinking mode, back to before
the user turn and feeds it anew); an edit goes back to before the user turn and feeds the new one. Without a
snapshot (a reopened conversation) both read the conversation once.

A conversation with nothing cached (reopened, after a restart too) is read as its session held it (`replay`):
its first message through the template with the system prompt, then each reply as its tokens went into the cache
(reasoning included), its close text and the next user turn. The template would write earlier replies without
their reasoning, so the reopened prompt would part from the cache the live session left (on the disk's shelf)
at its first reply; this way it matches whole, and only the new message is read.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.engine.messages import ChatMessage
from macapp.core.engine.model_folder import Tokenizer
from macapp.core.engine.pictures import content_of, pictures_in
from macapp.core.engine.positions import SavedPosition
from macapp.core.events import TurnKind
from macapp.core.thinking import ThinkingSplitter
from macapp.core.vision.images import PreparedImage

CLOSE_REASONING = "</think>\n\n"


class ThinkingMode(enum.Enum):
    OFF = "off"
    ON = "on"
    CLOSED = "closed"  # thinking on with a budget of 0: the prompt itself closes the reasoning

    @classmethod
    def of(cls, thinking: bool, budget: int | None) -> "ThinkingMode":
        if not thinking:
            return cls.OFF
        return cls.CLOSED if budget == 0 else cls.ON

    @property
    def thinking(self) -> bool:
        return self is not ThinkingMode.OFF


@dataclass(frozen=True, kw_only=True)
class TurnMemory:
    """What a session remembers of its last turn, for regenerate and edit."""

    before_turn: SavedPosition  # the cache before this turn's prompt (edit goes back here)
    close_before: str  # the previous reply's pending close text at that point
    prefix: list[int] | None  # prompt tokens before the user message (closing text, or system/history)
    before_last: SavedPosition  # before the prompt's last token (regenerate goes back here)
    last_token: int
    mode: ThinkingMode


@dataclass(frozen=True, kw_only=True)
class TurnPlan:
    """How to run one turn: what to restore, what to feed, what the conversation is before it."""

    kind: TurnKind
    mode: ThinkingMode
    prompt: list[int]  # tokens to feed, the last one by the reply stream
    user_text: str
    history: list[ChatMessage]  # the conversation before this turn's user message
    prefix: list[int] | None  # prompt tokens before the user message; None when the template does not split there
    close_before: str  # the previous reply's close text, back in place if the turn is undone
    restore: SavedPosition | None = None  # go back here first (regenerate / edit from a snapshot)
    turn_start: SavedPosition | None = None  # the turn's known start (regenerate); None: where the cache is
    images: tuple[PreparedImage, ...] = ()  # the pictures the prompt's image placeholders stand for, in order
    user_images: tuple[PreparedImage, ...] = ()  # the pictures of this turn's user message

    @property
    def rereads(self) -> bool:
        """A regenerate or edit without a snapshot: the cache starts empty and reads the whole conversation."""
        return self.kind is not TurnKind.SEND and self.restore is None

    @property
    def undo_on_stop(self) -> bool:
        """A stop while the prompt is read undoes the turn. Not for a regenerate from a snapshot: it reads on (one
        short turn) and stops at its first token, so its user message stays in the cache."""
        return not (self.kind is TurnKind.REGENERATE and self.restore is not None)

    @property
    def keeps_message_on_undo(self) -> bool:
        """An undone regenerate that re-read the conversation keeps its user message: the next send reads it all."""
        return self.kind is TurnKind.REGENERATE and self.restore is None


# ---------------------------------------------------------------------------------------------- prompts


def template(tokenizer: Tokenizer, messages: list[ChatMessage], thinking: bool) -> list[int]:
    """Qwen3.5's chat template over role/content messages (pictures as image parts), ready for the reply, with
    explicit enable_thinking."""
    msgs = [{"role": x["role"], "content": content_of(x)} for x in messages]
    return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=thinking))


def full_prompt(
    tokenizer: Tokenizer, system_prompt: str | None, history: list[ChatMessage], text: str, thinking: bool, images: tuple[PreparedImage, ...] = ()
) -> tuple[list[int] | None, list[int]]:
    """(prefix, all tokens) for reading the whole conversation and a new user message through the template."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    full = template(tokenizer, system + history + [{"role": "user", "content": text, "images": images}], thinking)
    user = template(tokenizer, [{"role": "user", "content": text, "images": images}], thinking)
    prefix = full[: len(full) - len(user)] if full[len(full) - len(user) :] == user else None
    return prefix, full


def reread(
    tokenizer: Tokenizer, system_prompt: str | None, history: list[ChatMessage], text: str, mode: ThinkingMode, images: tuple[PreparedImage, ...] = ()
) -> tuple[list[int] | None, list[int]]:
    """(prefix, all tokens) for reading a conversation with nothing cached and a new user message: as a session held
    it (`replay`), or through the template when `history` is not one a session made turn by turn."""
    held = replay(tokenizer, system_prompt, history)
    if held is None:
        return full_prompt(tokenizer, system_prompt, history, text, mode.thinking, images)
    tokens, close = held
    prefix = tokens + _encode(tokenizer, close)
    return prefix, prefix + _user_turn(tokenizer, text, mode, images)


def replay(tokenizer: Tokenizer, system_prompt: str | None, history: list[ChatMessage]) -> tuple[list[int], str] | None:
    """The tokens a chat session's cache held after `history`, and the close text its last reply left pending: the
    first user message through the template with the system prompt, its reply (`held_reply`), then for each later
    exchange the previous reply's close text, the user turn and its reply, as `plan_send` appended them. None when
    `history` is not a session's: empty, not user/reply pairs, or a reply without its "thinking" flag."""
    pairs = list(zip(history[::2], history[1::2]))
    if (
        not history
        or len(history) % 2
        or any(u.get("role") != "user" or a.get("role") != "assistant" or not isinstance(a.get("thinking"), bool) for u, a in pairs)
    ):
        return None
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    tokens, close = template(tokenizer, [*system, pairs[0][0]], pairs[0][1]["thinking"]), ""
    for i, (user, reply) in enumerate(pairs):
        if i:
            tokens += _encode(tokenizer, close) + template(tokenizer, [user], reply["thinking"])
        said, close = held_reply(tokenizer, reply)
        tokens += said
    return tokens, close


def held_reply(tokenizer: Tokenizer, reply: ChatMessage) -> tuple[list[int], str]:
    """A reply's tokens after its generation prompt and its close text. Exact from its "cache_tokens" (events.Reply's)
    when they say what the reply says (its reasoning and answer, read back with this tokenizer); otherwise its text
    re-tokenized, reasoning and answer in the template's form, closed by <|im_end|> (a reply cut short is closed as
    the live session's close text would have closed it): the same text, possibly other tokens, read again."""
    thinking = bool(reply.get("thinking"))
    reasoning, answer = str(reply.get("reasoning") or ""), str(reply.get("content") or "")
    stored = [t for t in reply.get("cache_tokens") or () if isinstance(t, int)]
    if stored:
        eos = set(tokenizer.eos_token_ids)
        splitter = ThinkingSplitter(in_reasoning=thinking)
        splitter.feed(tokenizer.decode(stored[:-1] if stored[-1] in eos else stored))
        splitter.flush()
        if (splitter.reasoning_text, splitter.answer_text) == (reasoning, answer):
            return stored, close_text(stored[-1], tokenizer.convert_tokens_to_ids("<|im_end|>"), splitter.in_reasoning)
    text = reasoning.strip("\n") + "\n" + CLOSE_REASONING + answer.lstrip("\n") if thinking else answer
    return _encode(tokenizer, text + "<|im_end|>"), "\n"


def held_tokens(tokenizer: Tokenizer, mode: ThinkingMode, added: list[int]) -> list[int]:
    """A turn's tokens after its generation prompt (events.Reply.cache_tokens): a budget-0 prompt's closing tag, then
    what its reply put in the cache after the prompt's last token (`added`: StreamedReply.tokens_added, which
    starts with that token, the closing tag's last when there is one)."""
    closing = _encode(tokenizer, CLOSE_REASONING) if mode is ThinkingMode.CLOSED else []
    return closing + added[1:]


def close_text(last: int | None, im_end_id: int | None, still_reasoning: bool) -> str:
    """What the next turn feeds first to close a reply whose last token in the cache is `last`."""
    if last is not None and last == im_end_id:
        return "\n"
    return "\n</think>\n\n<|im_end|>\n" if still_reasoning else "<|im_end|>\n"


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _closed(tokenizer: Tokenizer, prompt: list[int], mode: ThinkingMode) -> list[int]:
    if mode is ThinkingMode.CLOSED:  # no reasoning at all: the prompt closes it
        return prompt + _encode(tokenizer, CLOSE_REASONING)
    return prompt


def _user_turn(tokenizer: Tokenizer, text: str, mode: ThinkingMode, images: tuple[PreparedImage, ...] = ()) -> list[int]:
    return template(tokenizer, [{"role": "user", "content": text, "images": images}], mode.thinking)


# ---------------------------------------------------------------------------------------------- plans


def require_text(text: str) -> None:
    """A message must say something; EngineError EMPTY_PROMPT otherwise (before any work)."""
    if not (text or "").strip():
        raise EngineError("The message is empty: type something to send.", ev.EMPTY_PROMPT)


def plan_send(
    tokenizer: Tokenizer,
    *,
    text: str,
    mode: ThinkingMode,
    messages: list[ChatMessage],
    system_prompt: str | None,
    close_text: str | None,
    images: tuple[PreparedImage, ...] = (),
) -> TurnPlan:
    """A new user message (see require_text) with its `images`. `close_text`: what closes the cached previous reply;
    None when nothing is cached."""
    if close_text is None:
        prefix, prompt = reread(tokenizer, system_prompt, messages, text, mode, images)
        in_prompt = tuple(pictures_in(messages)) + tuple(images)
    else:
        prefix = _encode(tokenizer, close_text)
        prompt = prefix + _user_turn(tokenizer, text, mode, images)
        in_prompt = tuple(images)
    return TurnPlan(
        kind=TurnKind.SEND,
        mode=mode,
        prompt=_closed(tokenizer, prompt, mode),
        user_text=text,
        history=list(messages),
        prefix=prefix,
        close_before=close_text or "",
        images=in_prompt,
        user_images=tuple(images),
    )


def last_user_index(messages: list[ChatMessage], new_text: str | None) -> int:
    """Where the message a regenerate (`new_text` None) or edit answers again is; EngineError if there is none."""
    if new_text is not None:
        require_text(new_text)
    users = [i for i, msg in enumerate(messages) if msg.get("role") == "user"]
    if not users:
        raise EngineError("There is no message to answer again yet.", ev.NOTHING_TO_REDO)
    return users[-1]


def plan_redo(
    tokenizer: Tokenizer,
    *,
    new_text: str | None,
    thinking: bool | None,
    budget: int | None,
    messages: list[ChatMessage],
    last_user: int,
    system_prompt: str | None,
    last: TurnMemory | None,
) -> TurnPlan:
    """Regenerate (`new_text` None) or edit the exchange at `last_user` (see last_user_index). `thinking` None keeps
    the last reply's mode (on if it has none); `last`: the session's memory of its last turn, None without a cache."""
    tail = messages[last_user + 1 :]
    old_thinking = tail[0].get("thinking") if tail and tail[0].get("role") == "assistant" else None
    if thinking is None:
        thinking = bool(old_thinking if old_thinking is not None else True)
    mode = ThinkingMode.of(bool(thinking), budget)
    kind = TurnKind.REGENERATE if new_text is None else TurnKind.EDIT
    text = new_text if new_text is not None else messages[last_user]["content"]
    pictures = tuple(messages[last_user].get("images") or ())  # an edit keeps the message's pictures
    # what every plan below shares; each fills in what it feeds and where it goes back to
    common = TurnPlan(
        kind=kind,
        mode=mode,
        prompt=[],
        user_text=text,
        history=messages[:last_user],
        prefix=None,
        close_before="",
        user_images=pictures,
    )
    if last is not None and len(tail) <= 1:
        if kind is TurnKind.REGENERATE and mode is last.mode:
            # back to just before the prompt's last token, and feed that one token again
            return dataclasses.replace(
                common,
                prompt=[last.last_token],
                prefix=last.prefix,
                close_before=last.close_before,
                restore=last.before_last,
                turn_start=last.before_turn,
            )
        if last.prefix is not None:
            # edit (or another thinking mode): back to before the user message; feed the new turn
            prompt = last.prefix + _user_turn(tokenizer, text, mode, pictures)
            return dataclasses.replace(
                common,
                prompt=_closed(tokenizer, prompt, mode),
                prefix=last.prefix,
                close_before=last.close_before,
                restore=last.before_turn,
                turn_start=last.before_turn,
                images=pictures,
            )
    # No snapshot for this turn (a reopened conversation): read the conversation once, as a session held it.
    prefix, prompt = reread(tokenizer, system_prompt, common.history, text, mode, pictures)
    return dataclasses.replace(
        common,
        prompt=_closed(tokenizer, prompt, mode),
        prefix=prefix,
        close_before="",
        images=tuple(pictures_in(common.history)) + pictures,
    )
