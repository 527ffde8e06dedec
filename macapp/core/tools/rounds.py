"""The tool results as the next round's message: what Qwen3.5's template writes for `tool` messages (one user turn
of ``<tool_response>`` blocks), sent with the session's own `send`, so that a round reads only them (prompt reuse).
A saved reply's calls keep their rounds (events.ToolCallRecord: round, at, said), so `session_rounds` gives a
reopened conversation the messages the session held: each round's own text, its results, then the answer.
Pure text, no MLX: the history and the conversation model read it too."""

from __future__ import annotations

from typing import Mapping, Sequence

RESPONSE_OPEN = "<tool_response>"
DENIED = "The user denied this tool call; it did not run. Do not call it again unless the user asks."
ROUNDS_REASON = "tool_rounds"  # finish_reason of a turn stopped by the round bound (its last results never sent)
ROUND_JOIN = "\n\n"  # between two rounds' answer text in the reply


def has_tool_rounds(messages: Sequence[Mapping[str, object]]) -> bool:
    """Whether the last exchange of a session's `messages` holds tool rounds (a user message of tool results)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content") or "").startswith(RESPONSE_OPEN)
    return False


def tool_responses(results: Sequence[str]) -> str:
    """The next round's message: each result (already made safe: results.for_prompt) in a <tool_response> block."""
    return "\n".join(f"{RESPONSE_OPEN}\n{r}\n</tool_response>" for r in results)


def _is_results(message: Mapping[str, object]) -> bool:
    return message.get("role") == "user" and str(message.get("content") or "").startswith(RESPONSE_OPEN)


def session_rounds(content: str, finish_reason: str | None, calls: Sequence[Mapping[str, object]]) -> list[dict[str, str]] | None:
    """A saved reply with tool calls as the session held it: per round that called, an assistant message of what
    the round wrote (markup included) and, when a later round read them, a user message of its results; then the
    answer round's text (the reply's text after the last call), if there was one. None when the calls do not
    carry their rounds (saved before they did) or there are none."""
    rounds: dict[int, list[Mapping[str, object]]] = {}
    for call in calls:
        number = call.get("round")
        if not isinstance(number, int) or number < 1 or not call.get("said"):
            return None
        rounds.setdefault(number, []).append(call)
    if not rounds:
        return None
    ordered = [rounds[n] for n in sorted(rounds)]
    at = ordered[-1][0].get("at")
    tail = content[at:] if isinstance(at, int) else ""
    if at and tail.startswith(ROUND_JOIN):
        tail = tail[len(ROUND_JOIN) :]
    answered = bool(tail) and finish_reason != ROUNDS_REASON
    out: list[dict[str, str]] = []  # role and content
    for i, group in enumerate(ordered):
        out.append({"role": "assistant", "content": str(group[0]["said"])})
        if i < len(ordered) - 1 or answered:
            out.append({"role": "user", "content": tool_responses([str(c["result"]) if c.get("result") is not None else DENIED for c in group])})
    if answered:
        out.append({"role": "assistant", "content": tail})
    return out


def without_rounds(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """`messages` with the last exchange's tool rounds folded away (its user message, then its last reply): what a
    regenerate or edit of that exchange answers again."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user" and not _is_results(m)]
    if not users or not any(_is_results(m) for m in out[users[-1] :]):
        return out
    return out[: users[-1] + 1] + ([out[-1]] if out[-1].get("role") == "assistant" else [])
