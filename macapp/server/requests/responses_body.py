"""The body of OpenAI's `POST /v1/responses`, and the CompletionRequest it asks for (the input items:
responses_input.py).

`instructions` become the system prompt. Tools of type `function` are offered; the hosted and client tool types
this server cannot run (`web_search`, `namespace`, `custom`, `local_shell`, ...) are accepted and left out, so a
client that sends them keeps working. `reasoning.effort` none / minimal is thinking off, the others on with a
budget. What silently ignored would hand the client something else than it asked for (structured `text.format`,
`background`, `conversation`, stored `prompt`) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from pydantic import AfterValidator, JsonValue, ModelWrapValidatorHandler, PlainValidator, PrivateAttr, model_validator

from macapp.core.jsonvalue import JSONObject

from macapp.core.serving.requests import ChatMessage, CompletionRequest, Role, ToolChoice, ToolChoiceMode, ToolSpec
from macapp.server.errors import invalid
from macapp.server.requests.common import Count, Fraction, JSONObjectField, Model, Refusal, kinds, sampling_for, tag, within
from macapp.server.requests.responses_input import Input, conversation

# reasoning.effort: none / minimal are thinking off; the others on, with a thinking budget (None: the engine's own).
EFFORT_BUDGETS: dict[str, int | None] = {"low": 2048, "medium": 8192, "high": None, "xhigh": None}
_EFFORTS_OFF = ("none", "minimal")
_HOSTED_CHOICES = frozenset(
    {
        "file_search",
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "computer_use_preview",
        "image_generation",
        "code_interpreter",
        "mcp",
        "custom",
        "local_shell",
        "apply_patch",
        "shell",
    }
)
_MODES = {"auto": ToolChoiceMode.AUTO, "none": ToolChoiceMode.NONE, "required": ToolChoiceMode.REQUIRED}


@dataclass(frozen=True)
class ResponsesCall:
    request: CompletionRequest  # the whole prompt: instructions, the previous response's conversation, this input
    conversation: tuple[ChatMessage, ...]  # the same without the instructions: what a continuation starts from
    stream: bool = False
    store: bool = True
    echo: dict[str, object] = field(default_factory=dict)  # what the response object repeats of the request


# ------------------------------------------------------------------------------------------------ tools


class FunctionTool(Model):
    """Flat, as the Responses API sends it; `strict` accepted."""

    strict: bool | None = None
    name: str
    description: str | None = None
    parameters: JSONObjectField | None = None

    def to_spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description or "", self.parameters or {})


class LeftOutTool(Model):
    """web_search, namespace, custom, local_shell, ...: nothing here runs them."""


def _tool_kind(value: object) -> str | None:
    kind = value.get("type", "function") if isinstance(value, dict) else None
    return "function" if kind == "function" else "left_out" if isinstance(kind, str) else None


Tool = Annotated[
    Annotated[FunctionTool, tag("function")] | Annotated[LeftOutTool, tag("left_out")],
    kinds("{param} must be a string.", tag_of=_tool_kind),
]


def _mode(value: object) -> ToolChoiceMode:
    if not isinstance(value, str) or value not in _MODES:
        raise Refusal(f"{{param}} {value!r} is not 'auto', 'none', 'required' or an object.")
    return _MODES[value]


class NamedTool(Model):
    name: str


def _allowed_kind(value: object) -> str | None:
    if not isinstance(value, dict):
        return None
    return "function" if value.get("type", "function") == "function" else "left_out"


AllowedTool = Annotated[
    Annotated[NamedTool, tag("function")] | Annotated[LeftOutTool, tag("left_out")],  # a hosted one: left out, as in tools
    kinds("{param} must be an object.", tag_of=_allowed_kind),
]


class AllowedTools(Model):
    mode: Literal["auto", "required"]
    tools: list[AllowedTool]


class HostedChoice(Model):
    """A tool left out (see Tool): the model chooses among the rest."""


def _choice_kind(value: object) -> object:
    if isinstance(value, str):
        return "mode"
    kind = value.get("type") if isinstance(value, dict) else None
    return "hosted" if isinstance(kind, str) and kind in _HOSTED_CHOICES else kind


ToolChoiceValue = Annotated[
    Annotated[ToolChoiceMode, PlainValidator(_mode), tag("mode")]
    | Annotated[NamedTool, tag("function")]
    | Annotated[AllowedTools, tag("allowed_tools")]
    | Annotated[HostedChoice, tag("hosted")],
    kinds("{param} {kind} is not supported ('function', 'allowed_tools' or a string).", tag_of=_choice_kind),
]


def _tool_choice(value: ToolChoiceValue | None, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    names = {t.name for t in tools}
    match value:
        case ToolChoiceMode():
            return ToolChoice(value)
        case NamedTool(name=name):
            if name not in names:
                raise invalid(f"tool_choice names {name!r}, which is not in tools.", param="tool_choice.name")
            return ToolChoice(ToolChoiceMode.FUNCTION, name)
        case AllowedTools(mode=mode, tools=allowed):
            chosen = [t.name for t in allowed if isinstance(t, NamedTool)]
            unknown = sorted(set(chosen) - names)
            if unknown:
                raise invalid(f"tool_choice.tools names {', '.join(map(repr, unknown))}, not in tools.", param="tool_choice.tools")
            return ToolChoice(_MODES[mode], allowed=tuple(chosen))
    return ToolChoice()  # none given, or a hosted tool's


# ------------------------------------------------------------------------------------------------ options


def _effort(value: str) -> str:
    if value not in (*_EFFORTS_OFF, *EFFORT_BUDGETS):
        raise Refusal(f"{{param}} {value!r} is not one of none, minimal, low, medium, high, xhigh.")
    return value


class Reasoning(Model):
    effort: Annotated[str, AfterValidator(_effort)] | None = None
    summary: str | None = None

    def thinking(self, default: bool) -> tuple[bool, int | None]:
        """none / minimal -> off; low, medium, high, xhigh -> on with EFFORT_BUDGETS; absent -> default."""
        if self.effort is None:
            return default, None
        if self.effort in _EFFORTS_OFF:
            return False, None
        return True, EFFORT_BUDGETS[self.effort]


class TextFormat(Model):
    type: JsonValue = "text"

    @model_validator(mode="after")
    def _only_text(self) -> TextFormat:
        if self.type != "text":
            raise Refusal(f"{{param}} {self.type!r} (structured output) is not supported: only 'text'; ask for JSON in the prompt.")
        return self


class TextOptions(Model):
    format: TextFormat | None = None


def _no_background(value: bool | None) -> bool | None:
    if value:
        raise Refusal("background responses are not supported: send the request without background (stream it to follow it).")
    return value


def _absent(message: str) -> AfterValidator:
    def check(value: JsonValue) -> JsonValue:
        if value is not None:
            raise Refusal(message)
        return value

    return AfterValidator(check)


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise Refusal("{param} must be an object of string values.")
    return value


# ------------------------------------------------------------------------------------------------ the body

Temperature = Annotated[float, within(0, 2)]


class ResponsesBody(Model):
    """The fields read, in the order they are checked (the first one at fault is the one named)."""

    instructions: str | None = None
    input: Input = []
    reasoning: Reasoning | None = None
    text: TextOptions | None = None
    background: Annotated[bool | None, AfterValidator(_no_background)] = None
    conversation: Annotated[JsonValue, _absent("conversation (the Conversations API) is not supported: send the whole input, or previous_response_id.")] = None
    prompt: Annotated[JsonValue, _absent("prompt (stored prompt templates) is not supported: send instructions and input.")] = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: Fraction | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceValue | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: Annotated[dict[str, str] | None, PlainValidator(_metadata)] = None
    previous_response_id: str | None = None
    stream: bool | None = None
    model: JsonValue = None  # any name is served by the loaded model
    truncation: JsonValue = None  # "auto" or "disabled": a prompt over the context is refused either way
    user: JsonValue = None
    _sent: JSONObject = PrivateAttr(default_factory=dict)  # tools and tool_choice as sent, for the echo

    @model_validator(mode="wrap")
    @classmethod
    def _keep_sent(cls, value: object, handler: ModelWrapValidatorHandler[ResponsesBody]) -> ResponsesBody:
        body = handler(value)
        if isinstance(value, dict):
            body._sent = {"tools": value.get("tools") or [], "tool_choice": value.get("tool_choice")}
        return body

    def to_call(self, default_thinking: bool, client: str = "", previous: tuple[ChatMessage, ...] = ()) -> ResponsesCall:
        """`previous`: the conversation of the response named by previous_response_id, which this input continues."""
        talk = conversation(self.input, previous)
        if not any(m.role in (Role.USER, Role.ASSISTANT, Role.TOOL) for m in talk):
            raise invalid("input must hold at least one user, assistant or tool output item (instructions alone are not a prompt).", param="input")
        messages = ((ChatMessage(Role.SYSTEM, self.instructions),) if self.instructions else ()) + talk
        reasoning = self.reasoning or Reasoning()
        thinking, budget = reasoning.thinking(default_thinking)
        sampling = sampling_for(thinking, self.max_output_tokens, temperature=self.temperature, top_p=self.top_p)
        tools = tuple(t.to_spec() for t in self.tools or () if isinstance(t, FunctionTool))
        tool_choice = _tool_choice(self.tool_choice, tools)
        parallel = self.parallel_tool_calls if self.parallel_tool_calls is not None else True
        if not parallel:
            tool_choice = replace(tool_choice, parallel=False)
        store = self.store if self.store is not None else True
        request = CompletionRequest(
            messages=messages,
            sampling=sampling,
            thinking=thinking,
            thinking_budget=budget,
            tools=tools,
            tool_choice=tool_choice,
            client=client,
        )
        return ResponsesCall(request, talk, bool(self.stream), store, self._echo(reasoning, sampling.temperature, sampling.top_p, parallel, store))

    def _echo(self, reasoning: Reasoning, temperature: float, top_p: float, parallel: bool, store: bool) -> dict[str, object]:
        return {
            "instructions": self.instructions or None,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata or {},
            "parallel_tool_calls": parallel,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary},
            "store": store,
            "temperature": temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": self._sent.get("tool_choice") if self._sent.get("tool_choice") is not None else "auto",
            "tools": self._sent.get("tools", []),
            "top_p": top_p,
            "truncation": "disabled",
            "user": self.user if isinstance(self.user, str) else None,
        }
