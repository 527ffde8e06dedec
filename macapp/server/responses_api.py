"""OpenAI Responses (`POST /v1/responses`): a request body -> CompletionRequest, as Codex and `client.responses.create`
send it.

`instructions` become the system prompt; `input` is a string or a list of items: messages (`system` / `developer` /
`user` / `assistant`; `input_text`, `output_text`, `refusal`, `input_image` data URLs), `function_call` and
`function_call_output` items (and Codex's `custom_tool_call` / `custom_tool_call_output`), `reasoning` items sent back
(read into the next assistant turn's reasoning). Items the server never produced and cannot replay (web search calls,
local shell calls, …) are left out of the prompt. Tools of type `function` are offered; the hosted and client tool
types this server cannot run (`web_search`, `namespace`, `custom`, `local_shell`, …) are accepted and left out, so a
client that sends them keeps working. The reply side is responses_output.py; the route responses_route.py.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from macapp.core.serving.requests import (
    ChatMessage,
    CompletionRequest,
    ImagePart,
    Role,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)
from macapp.server import fields as f
from macapp.server.errors import invalid

ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT}
_TEXT_PARTS = ("input_text", "output_text", "text")
# reasoning.effort: none / minimal are thinking off; the others on, with a thinking budget (None: the engine's own).
EFFORT_BUDGETS: dict[str, int | None] = {"low": 2048, "medium": 8192, "high": None, "xhigh": None}
_EFFORTS_OFF = ("none", "minimal")
# Output items of tools that run elsewhere (OpenAI's servers, the client's shell): nothing here can replay them.
SKIPPED_ITEMS = frozenset({
    "web_search_call", "file_search_call", "computer_call", "computer_call_output", "image_generation_call",
    "code_interpreter_call", "local_shell_call", "local_shell_call_output", "mcp_list_tools", "mcp_approval_request",
    "mcp_approval_response", "mcp_call", "compaction", "compaction_summary", "ghost_snapshot", "tool_search_call",
    "tool_search_output",
})
_HOSTED_CHOICES = frozenset({
    "file_search", "web_search", "web_search_preview", "web_search_preview_2025_03_11", "computer_use_preview",
    "image_generation", "code_interpreter", "mcp", "custom", "local_shell", "apply_patch", "shell",
})
USED_FIELDS = frozenset({  # the others (prompt_cache_key, include, client_metadata, service_tier, …) are logged once
    "model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "max_output_tokens",
    "temperature", "top_p", "store", "previous_response_id", "metadata", "text", "stream", "background", "conversation",
    "prompt", "truncation", "user",
})
CUSTOM_INPUT = "input"  # a custom tool call's raw input, as the template's argument mapping holds it


@dataclass(frozen=True)
class ResponsesCall:
    request: CompletionRequest  # the whole prompt: instructions, the previous response's conversation, this input
    conversation: tuple[ChatMessage, ...]  # the same without the instructions: what a continuation starts from
    stream: bool = False
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)  # what the response object repeats of the request


# ------------------------------------------------------------------------------------------------ input items


def _text_and_images(value: Any, param: str) -> tuple[str, tuple[ImagePart, ...]]:
    """A message's (or a tool output's) content: a string or a list of content parts."""
    if value is None:
        return "", ()
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise invalid(f"{param} must be a string or an array of content parts.", param=param)
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(value):
        where = f"{param}[{j}]"
        part = f.require_object(part, where)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(f.get_str(part, "text", f"{where}.text", required=True))
        elif kind == "refusal":
            texts.append(f.get_str(part, "refusal", f"{where}.refusal", required=True))
        elif kind == "input_image":
            if part.get("image_url") is None:
                raise invalid(f"{where}: only image_url data: URLs are supported (no file_id: this server has no Files API).", param=f"{where}.image_url")
            url = part["image_url"]
            images.append(f.image_from_url(url.get("url") if isinstance(url, dict) else url, f"{where}.image_url"))
        elif kind == "input_file":
            raise invalid(f"{where}: input_file is not supported: send the file's text as input_text.", param=f"{where}.type")
        else:
            raise invalid(f"{where}.type {kind!r} is not supported (input_text, output_text, input_image).", param=f"{where}.type")
    return "".join(texts), tuple(images)


@dataclass
class _Turns:
    """Builds the conversation item by item: function calls join the assistant turn they follow, a reasoning item
    waits for the assistant turn after it (the order a response's output comes in)."""

    messages: list[ChatMessage] = field(default_factory=list)
    call_names: dict[str, str] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)

    def add(self, message: ChatMessage) -> None:
        if message.role is Role.ASSISTANT and self.reasoning:
            message = replace(message, reasoning="\n".join(self.reasoning))
        if message.role is not Role.ASSISTANT or self.reasoning:
            self.reasoning = []
        self.messages.append(message)

    def add_call(self, call: ToolCall) -> None:
        self.call_names[call.id] = call.name
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role is Role.ASSISTANT and not self.reasoning:
            self.messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
        elif last is not None and last.role is Role.ASSISTANT:  # a reasoning item between the text and the call
            joined = "\n".join(filter(None, [last.reasoning, *self.reasoning]))
            self.messages[-1] = replace(last, reasoning=joined, tool_calls=(*last.tool_calls, call))
            self.reasoning = []
        else:
            self.add(ChatMessage(Role.ASSISTANT, "", tool_calls=(call,)))


def _message(item: dict, param: str) -> ChatMessage:
    role_name = item.get("role")
    if role_name not in ROLES:
        raise invalid(f"{param}.role {role_name!r} is not one of 'system', 'developer', 'user', 'assistant'.", param=f"{param}.role")
    role = ROLES[role_name]
    text, images = _text_and_images(item.get("content"), f"{param}.content")
    if images and role is not Role.USER:  # the template has no place for them: never dropped silently
        raise invalid(f"{param}: pictures go in user messages (or function_call_output), not in a {role_name} message.", param=f"{param}.content")
    return ChatMessage(role, text, images=images)


def _reasoning_text(item: dict, param: str) -> str:
    """A reasoning item's text: its reasoning_text content when sent, else its summary (what this server writes)."""
    for key, kinds in (("content", ("reasoning_text", "text")), ("summary", ("summary_text",))):
        parts = f.get_list(item, key, f"{param}.{key}")
        texts = []
        for j, part in enumerate(parts):
            part = f.require_object(part, f"{param}.{key}[{j}]")
            if part.get("type") in kinds:
                texts.append(f.get_str(part, "text", f"{param}.{key}[{j}].text", default=""))
        if texts:
            return "\n".join(texts)
    return ""  # encrypted_content only: another server's, unreadable here


def _read_item(turns: _Turns, item: Any, param: str) -> None:
    item = f.require_object(item, param)
    kind = item.get("type", "message")
    match kind:
        case "message":
            message = _message(item, param)
            last = turns.messages[-1] if turns.messages else None
            if message.role is Role.ASSISTANT and last is not None and last.role is Role.ASSISTANT and not last.tool_calls and not turns.reasoning:
                turns.messages[-1] = replace(last, content=last.content + message.content)  # one turn in several items
            else:
                turns.add(message)
        case "function_call" | "custom_tool_call":
            call_id = f.get_str(item, "call_id", f"{param}.call_id", required=True)
            name = f.get_str(item, "name", f"{param}.name", required=True)
            if kind == "function_call":
                arguments = f.tool_arguments(item.get("arguments"), f"{param}.arguments")
            else:
                arguments = {CUSTOM_INPUT: f.get_str(item, "input", f"{param}.input", default="")}
            turns.add_call(ToolCall(id=call_id, name=name, arguments=arguments))
        case "function_call_output" | "custom_tool_call_output":
            call_id = f.get_str(item, "call_id", f"{param}.call_id", required=True)
            text, images = _text_and_images(item.get("output"), f"{param}.output")
            turns.add(ChatMessage(Role.TOOL, text, tool_call_id=call_id, name=turns.call_names.get(call_id), images=images))
        case "reasoning":
            text = _reasoning_text(item, param)
            if text:
                turns.reasoning.append(text)
        case "item_reference":
            raise invalid(f"{param}: item_reference is not supported: send the items themselves, or previous_response_id.", param=f"{param}.type")
        case str() if kind in SKIPPED_ITEMS:
            pass
        case _:
            raise invalid(f"{param}.type {kind!r} is not a supported input item.", param=f"{param}.type")


def parse_input(value: Any, previous: tuple[ChatMessage, ...] = ()) -> tuple[ChatMessage, ...]:
    """`input` after the previous response's conversation (if any)."""
    if isinstance(value, str):
        return (*previous, ChatMessage(Role.USER, value))
    if value is None:
        value = []
    if not isinstance(value, list):
        raise invalid("input must be a string or an array of input items.", param="input")
    turns = _Turns(messages=list(previous), call_names={c.id: c.name for m in previous for c in m.tool_calls})
    for i, item in enumerate(value):
        _read_item(turns, item, f"input[{i}]")
    return tuple(turns.messages)


# ------------------------------------------------------------------------------------------------ tools


def parse_tools(value: Any) -> tuple[ToolSpec, ...]:
    """Function tools (flat, as the Responses API sends them; `strict` accepted); other tool types are left out."""
    specs = []
    for j, item in enumerate(f.get_list({"tools": value}, "tools", "tools")):
        where = f"tools[{j}]"
        item = f.require_object(item, where)
        kind = item.get("type", "function")
        if not isinstance(kind, str):
            raise invalid(f"{where}.type must be a string.", param=f"{where}.type")
        if kind != "function":
            continue  # web_search, namespace, custom, local_shell, …: nothing here runs them
        f.get_bool(item, "strict", f"{where}.strict")
        specs.append(ToolSpec(
            name=f.get_str(item, "name", f"{where}.name", required=True),
            description=f.get_str(item, "description", f"{where}.description", default=""),
            parameters=f.get_object(item, "parameters", f"{where}.parameters"),
        ))
    return tuple(specs)


def parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        modes = {"auto": ToolChoiceMode.AUTO, "none": ToolChoiceMode.NONE, "required": ToolChoiceMode.REQUIRED}
        if value not in modes:
            raise invalid(f"tool_choice {value!r} is not 'auto', 'none', 'required' or an object.", param="tool_choice")
        return ToolChoice(modes[value])
    choice = f.require_object(value, "tool_choice")
    kind = choice.get("type")
    names = {t.name for t in tools}
    if kind == "function":
        name = f.get_str(choice, "name", "tool_choice.name", required=True)
        if name not in names:
            raise invalid(f"tool_choice names {name!r}, which is not in tools.", param="tool_choice.name")
        return ToolChoice(ToolChoiceMode.FUNCTION, name)
    if kind == "allowed_tools":
        mode = {"auto": ToolChoiceMode.AUTO, "required": ToolChoiceMode.REQUIRED}.get(choice.get("mode"))
        if mode is None:
            raise invalid(f"tool_choice.mode {choice.get('mode')!r} is not 'auto' or 'required'.", param="tool_choice.mode")
        allowed = []
        for j, tool in enumerate(f.get_list(choice, "tools", "tool_choice.tools", required=True)):
            tool = f.require_object(tool, f"tool_choice.tools[{j}]")
            if tool.get("type", "function") == "function":
                allowed.append(f.get_str(tool, "name", f"tool_choice.tools[{j}].name", required=True))
        unknown = sorted(set(allowed) - names)
        if unknown:
            raise invalid(f"tool_choice.tools names {', '.join(map(repr, unknown))}, not in tools.", param="tool_choice.tools")
        return ToolChoice(mode, allowed=tuple(allowed))
    if kind in _HOSTED_CHOICES:
        return ToolChoice()  # a tool left out (see parse_tools): the model chooses among the rest
    raise invalid(f"tool_choice.type {kind!r} is not supported ('function', 'allowed_tools' or a string).", param="tool_choice.type")


# ------------------------------------------------------------------------------------------------ options


def parse_thinking(body: dict, default: bool) -> tuple[bool, int | None]:
    """reasoning.effort: none / minimal -> off; low, medium, high, xhigh -> on with EFFORT_BUDGETS; absent -> default."""
    reasoning = f.get_object(body, "reasoning", "reasoning")
    effort = f.get_str(reasoning, "effort", "reasoning.effort")
    f.get_str(reasoning, "summary", "reasoning.summary")
    if effort is None:
        return default, None
    if effort in _EFFORTS_OFF:
        return False, None
    if effort not in EFFORT_BUDGETS:
        raise invalid(f"reasoning.effort {effort!r} is not one of none, minimal, low, medium, high, xhigh.", param="reasoning.effort")
    return True, EFFORT_BUDGETS[effort]


def _refuse_unsupported(body: dict) -> None:
    """What silently ignored would hand the client something else than it asked for."""
    text = f.get_object(body, "text", "text")
    text_format = f.get_object(text, "format", "text.format")
    if text_format.get("type", "text") != "text":
        raise invalid(
            f"text.format {text_format.get('type')!r} (structured output) is not supported: only 'text'; ask for JSON in the prompt.",
            param="text.format",
        )
    if f.get_bool(body, "background", "background", default=False):
        raise invalid("background responses are not supported: send the request without background (stream it to follow it).", param="background")
    if body.get("conversation") is not None:
        raise invalid("conversation (the Conversations API) is not supported: send the whole input, or previous_response_id.", param="conversation")
    if body.get("prompt") is not None:
        raise invalid("prompt (stored prompt templates) is not supported: send instructions and input.", param="prompt")


def _metadata(body: dict) -> dict[str, str] | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("metadata must be an object of string values.", param="metadata")
    return metadata


def parse_responses_request(
    body: dict, default_thinking: bool, client: str = "", previous: tuple[ChatMessage, ...] = ()
) -> ResponsesCall:
    """The request; `previous` is the conversation of the response named by previous_response_id (the route looks
    it up), which this input continues."""
    f.note_ignored(body, USED_FIELDS, "responses")
    instructions = f.get_str(body, "instructions", "instructions", default="")
    conversation = parse_input(body.get("input"), previous)
    if not any(m.role in (Role.USER, Role.ASSISTANT, Role.TOOL) for m in conversation):
        raise invalid("input must hold at least one user, assistant or tool output item (instructions alone are not a prompt).", param="input")
    messages = ((ChatMessage(Role.SYSTEM, instructions),) if instructions else ()) + conversation
    thinking, budget = parse_thinking(body, default_thinking)
    reasoning = f.get_object(body, "reasoning", "reasoning")
    _refuse_unsupported(body)
    max_tokens = f.get_int(body, "max_output_tokens", "max_output_tokens", minimum=1)
    sampling = f.sampling_for(
        thinking, max_tokens,
        temperature=f.get_float(body, "temperature", "temperature", 0, 2),
        top_p=f.get_float(body, "top_p", "top_p", 0, 1),
    )
    tools = parse_tools(body.get("tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = f.get_bool(body, "parallel_tool_calls", "parallel_tool_calls", default=True)
    if parallel is False:
        tool_choice = replace(tool_choice, parallel=False)
    store = f.get_bool(body, "store", "store", default=True)
    request = CompletionRequest(
        messages=messages, sampling=sampling, thinking=thinking, thinking_budget=budget, tools=tools,
        tool_choice=tool_choice, client=client,
    )
    echo = {
        "instructions": instructions or None,
        "max_output_tokens": max_tokens,
        "metadata": _metadata(body) or {},
        "parallel_tool_calls": parallel,
        "previous_response_id": f.get_str(body, "previous_response_id", "previous_response_id"),
        "reasoning": {key: reasoning.get(key) for key in ("effort", "summary")},
        "store": store,
        "temperature": sampling.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        "tools": f.get_list(body, "tools", "tools"),
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
    }
    return ResponsesCall(request, conversation, bool(f.get_bool(body, "stream", "stream", default=False)), store, echo)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
