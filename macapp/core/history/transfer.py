"""Conversations in and out of the app: JSON export/import (a stable, versioned format) and Markdown export."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import datetime, timezone

from macapp import __version__
from macapp.core.history.errors import ImportFormatError
from macapp.core.history.records import ROLES, Conversation, Message, MessageState, ReplyStats, Role, title_from_text
from macapp.core.jsonvalue import JSONObject
from macapp.core.picture_data import ImageRef, PictureFiles, data_url

EXPORT_FORMAT = "qwen-desk.conversation"
EXPORT_FORMAT_VERSION = 1


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_time(value: object, default: float) -> float:
    """A timestamp from seconds or an ISO 8601 string (UTC when it has no zone); `default` when neither."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return default
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    return default


def export_dict(conv: Conversation, include_reasoning: bool = True) -> dict[str, object]:
    """The conversation (with its messages) as a JSON-ready dict (the `export_json` document)."""
    messages = []
    for m in conv.messages:
        item: dict[str, object] = {
            "role": m.role.value,
            "content": m.content,
            "reasoning": m.reasoning if include_reasoning else None,
            "thinking": m.thinking,
            "created": iso_time(m.created),
        }
        if m.role is Role.ASSISTANT:
            stats = {k: v for k, v in asdict(m.stats).items() if v is not None}
            item.update(state=m.state.value, finish_reason=m.finish_reason, model=m.model, stats=stats)
        if m.images:
            item["images"] = _export_pictures(m.images)
        if m.tool_calls:
            item["tool_calls"] = m.tool_calls
        messages.append(item)
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_FORMAT_VERSION,
        "exported_by": f"Qwen Desk {__version__}",
        "id": conv.id,
        "title": conv.display_title,
        "model": conv.model,
        "created": iso_time(conv.created),
        "updated": iso_time(conv.updated),
        "system_prompt": conv.system_prompt,
        "settings": conv.settings,
        "reasoning_included": include_reasoning,
        "messages": messages,
    }


def export_json(conv: Conversation, include_reasoning: bool = True) -> str:
    return json.dumps(export_dict(conv, include_reasoning), ensure_ascii=False, indent=2) + "\n"


def export_markdown(conv: Conversation, include_reasoning: bool = True) -> str:
    lines = [f"# {conv.display_title}", ""]
    if conv.model:
        lines.append(f"- Model: {conv.model}")
    lines.append(f"- Created: {iso_time(conv.created)}")
    lines.append(f"- Updated: {iso_time(conv.updated)}")
    if conv.settings:
        lines.append("- Settings: " + ", ".join(f"{k}={v}" for k, v in sorted(conv.settings.items())))
    lines.append("")
    if conv.system_prompt:
        lines += ["## System", "", conv.system_prompt, ""]
    for m in conv.messages:
        lines += [f"## {m.role.capitalize()}", ""]
        if include_reasoning and m.reasoning:
            lines += ["<details><summary>Reasoning</summary>", "", m.reasoning.strip("\n"), "", "</details>", ""]
        if m.images:
            lines += [f"*[picture: {ref.name}, {ref.width}x{ref.height}]*" for ref in m.images] + [""]
        for call in m.tool_calls:
            lines += _markdown_call(call)
        lines += [m.content.strip("\n") if m.content else "*(no answer)*", ""]
        if m.role is Role.ASSISTANT:
            notes = [n for n in (m.model if m.model and m.model != conv.model else None, m.stats.summary()) if n]
            if m.state is not MessageState.COMPLETE:
                notes.append(f"{m.state}" + (f" ({m.finish_reason})" if m.finish_reason else ""))
            if notes:
                lines += ["*" + " · ".join(notes) + "*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _markdown_call(call: JSONObject) -> list[str]:
    """One tool call as a collapsible block: the tool, its arguments, its result (or that it was denied)."""
    tool = f"{call.get('server', '')}/{call.get('name', '')}"
    state = "" if call.get("allowed") else " (denied)"
    result = call.get("result")
    lines = [
        f"<details><summary>Tool call: {tool}{state}</summary>",
        "",
        "```json",
        json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False),
        "```",
        "",
    ]
    if result is not None:
        lines += ["```", str(result).strip("\n"), "```", ""]
    return lines + ["</details>", ""]


def _message_from_document(i: int, raw: object, now: float, pictures: PictureFiles | None) -> Message:
    if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("content", ""), str):
        raise ImportFormatError(f"Message {i + 1} needs a role ({', '.join(ROLES)}) and text content; got {str(raw)[:80]!r}.")
    # A reply exported while it streamed is not streaming any more; anything unknown counts as complete.
    state = MessageState.STOPPED if raw.get("state") in ("stopped", "streaming") else MessageState.COMPLETE
    return Message(
        id=0,
        conversation_id=0,
        position=i,
        role=Role(raw["role"]),
        content=raw.get("content") or "",
        reasoning=raw.get("reasoning") or "",
        thinking=bool(raw.get("thinking")),
        state=state,
        finish_reason=raw.get("finish_reason"),
        stats=ReplyStats.from_any(raw.get("stats")),
        model=raw.get("model"),
        created=parse_time(raw.get("created"), now),
        images=_import_pictures(i, raw.get("images"), pictures),
        tool_calls=[c for c in raw.get("tool_calls") or [] if isinstance(c, dict)] if isinstance(raw.get("tool_calls") or [], list) else [],
    )


def _export_pictures(refs: tuple[ImageRef, ...]) -> list[dict[str, object]]:
    """Each picture with its bytes as a data: URL, so an exported conversation carries its pictures."""
    return [{"name": ref.name, "width": ref.width, "height": ref.height, "data_url": data_url(ref)} for ref in refs]


def _import_pictures(i: int, raw: object, pictures: PictureFiles | None) -> tuple[ImageRef, ...]:
    """Pictures of an imported message, stored into the pictures folder by `pictures`; a bad one fails the import,
    by name, and so does a picture where no PictureFiles were given (it would be lost)."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise ImportFormatError(f'Message {i + 1}: "images" must be a list of pictures.')
    refs = []
    for n, item in enumerate(raw):
        name = str(item.get("name") or f"picture {n + 1}") if isinstance(item, dict) else f"picture {n + 1}"
        url = item.get("data_url") if isinstance(item, dict) else None
        if not url:
            continue  # exported while its file was gone: the text is still imported
        if pictures is None:
            raise ImportFormatError(f"Message {i + 1}: {name}: this history was opened without a way to store pictures.")
        try:
            refs.append(pictures.store_data_url(url, name))
        except ValueError as exc:  # vision's ImageError (not a picture, not fetched) is one
            raise ImportFormatError(f"Message {i + 1}: {exc}") from None
    return tuple(refs)


def conversation_from_document(data: JSONObject | str | bytes, pictures: PictureFiles | None = None) -> Conversation:
    """A new conversation (ids 0) from an exported JSON document, or any {messages: [{role, content}]}; its pictures
    are stored by `pictures`."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ImportFormatError(f"Not JSON: {exc}") from exc
    raw_messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(raw_messages, list):
        raise ImportFormatError('Expected a JSON object with a "messages" list (as written by history export).')
    fmt = data.get("format")
    if fmt not in (None, EXPORT_FORMAT):
        raise ImportFormatError(f"Unknown format {fmt!r}; expected {EXPORT_FORMAT!r}.")
    now = time.time()
    messages = [_message_from_document(i, raw, now, pictures) for i, raw in enumerate(raw_messages)]
    first_user = next((m.content for m in messages if m.role is Role.USER), "")
    title_field, prompt_field = data.get("title"), data.get("system_prompt")
    title = title_field if isinstance(title_field, str) else ""
    settings_field = data.get("settings")
    settings: JSONObject = settings_field if isinstance(settings_field, dict) else {}
    system_prompt = prompt_field if isinstance(prompt_field, str) else None
    return Conversation(
        id=0,
        title=title or title_from_text(first_user),
        model=str(data.get("model") or ""),
        created=parse_time(data.get("created"), now),
        updated=parse_time(data.get("updated"), now),
        system_prompt=system_prompt,
        settings=settings,
        messages=messages,
    )
