"""Qwen3.5's tool calls, parsed as the answer streams (pure; no MLX).

The model writes a call as ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n
</tool_call>``; one block may hold several ``<function=…>`` and a reply several blocks. mlx-lm's own
`qwen3_coder` parser reads each function (name, parameters, values typed by the tool's JSON schema); this
module finds the blocks in a stream and splits them into functions (qwen3_coder reads only the first).

- Text before a call stays answer text; only what may be the start of ``<tool_call>`` is held back. The
  whitespace between text and a call, and between calls, belongs to the format and is dropped.
- A call comes out whole, when its block closes (front ends get its name and arguments at once).
- A block that does not parse (no ``<function=NAME>``, no ``</function>``, text outside the parameters, a
  value its schema type rejects) comes back as the text the model wrote, never dropped. So does a block still open when the
  reply is cut short; one the model left open at its natural end is accepted if its functions are complete.
"""

from __future__ import annotations

import re
import uuid
from typing import Callable, Sequence

from macapp.core.jsonvalue import JSONObject, JSONValue
from macapp.core.serving.requests import ToolCall, ToolSpec
from macapp.core.serving.stops import partial_suffix

OPEN = "<tool_call>"  # mlx-lm's qwen3_coder.tool_call_start (tests/core/serving/test_toolcalls.py holds them equal)
CLOSE = "</tool_call>"  # qwen3_coder.tool_call_end; mlx-lm is imported where a call is read: it loads MLX, which the window
# must not at its start (the MCP tools pane imports this parser)
_FUNCTION = re.compile(r"<function=(.*?)</function>", re.DOTALL)
_NAME = re.compile(r"\s*[^\s<>=]+>")  # the function's name, closed by ">" before anything else
_PARAMETER = re.compile(r"<parameter=.*?</parameter>", re.DOTALL)

Piece = str | ToolCall  # what the parser gives back: answer text, or a complete call


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parameters(tool: ToolSpec) -> JSONObject:
    return tool.parameters or {"type": "object", "properties": {}}


def _function(tool: ToolSpec) -> JSONObject:
    return {"name": tool.name, "description": tool.description, "parameters": _parameters(tool)}


def tool_dicts(tools: Sequence[ToolSpec]) -> list[JSONObject]:
    """Tools in the OpenAI shape that chat templates and qwen3_coder read."""
    return [{"type": "function", "function": _function(t)} for t in tools]


_NULL = "null"


def _plain_type(schema: JSONValue) -> str | None:
    """The one JSON type a property schema allows, for qwen3_coder's converter, which reads only a single `type`
    string: `["integer", "null"]` (strict OpenAI schemas), `anyOf` / `oneOf` of one type and null (pydantic's
    Optional), `$ref` (an object), an `enum` of strings. None when the schema says no single type."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    kinds: set[str | None]
    if isinstance(kind, list):
        if not all(isinstance(k, str) for k in kind):  # a schema no validator reads ([["x"]]): no single type
            return None
        kinds = {k for k in kind if isinstance(k, str) and k != _NULL}
    elif "$ref" in schema:
        return "object"
    elif isinstance(alternatives := schema.get("anyOf") or schema.get("oneOf"), list):
        kinds = {_plain_type(s) for s in alternatives} - {_NULL}
    elif isinstance(enum := schema.get("enum"), list) and enum and all(isinstance(v, str) for v in enum):
        return "string"
    else:
        return None
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def parsing_schemas(tools: Sequence[ToolSpec]) -> list[JSONObject]:
    """The tools as qwen3_coder reads them to type the values: each property with its single type made explicit
    (the prompt shows the tools as the client sent them; only parsing uses this)."""
    out: list[JSONObject] = []
    for tool in tools:
        function = _function(tool)
        parameters = dict(_parameters(tool))
        properties = parameters.get("properties")
        if isinstance(properties, dict):
            parameters["properties"] = {
                name: {**prop, "type": kind} if isinstance(prop, dict) and (kind := _plain_type(prop)) else prop for name, prop in properties.items()
            }
        out.append({"type": "function", "function": {**function, "parameters": parameters}})
    return out


def parse_block(body: str, tools: Sequence[ToolSpec], new_id: Callable[[], str] = new_call_id) -> list[ToolCall] | None:
    """The calls in one block's body (between the tags), or None if it is not a well-formed block."""
    return _parse_block(body, parsing_schemas(tools), new_id)


def _parse_block(body: str, schemas: list[JSONObject], new_id: Callable[[], str]) -> list[ToolCall] | None:
    from mlx_lm.tool_parsers import qwen3_coder

    calls: list[ToolCall] = []
    pos = 0
    for match in _FUNCTION.finditer(body):
        name = _NAME.match(match.group(1))
        if body[pos : match.start()].strip() or name is None or _PARAMETER.sub("", match.group(1)[name.end() :]).strip():
            return None  # text around the functions, no name, or text between the parameters
        try:
            parsed = qwen3_coder.parse_tool_call(match.group(0), schemas)
        except Exception:  # a value the schema rejects (e.g. "3.5" for an integer): the block is text
            return None
        calls.append(ToolCall(id=new_id(), name=parsed["name"], arguments=dict(parsed["arguments"])))
        pos = match.end()
    if not calls or body[pos:].strip():
        return None
    return calls


class ToolCallParser:
    """Feed answer text as it streams; get text pieces and complete ToolCalls back, in order."""

    def __init__(self, tools: Sequence[ToolSpec], new_id: Callable[[], str] = new_call_id):
        self.tools = tuple(tools)
        self.new_id = new_id
        self._schemas = parsing_schemas(self.tools)  # once per reply, not per block
        self.calls: list[ToolCall] = []
        self._held = ""  # a possible start of OPEN
        self._space = ""  # whitespace whose fate the next text decides (dropped before a call)
        self._block: str | None = None  # the body of the open block, None outside one
        self._after_call = False  # no text since the last call: leading whitespace is the format's
        self._space_before = ""  # the whitespace held when the open block began

    @property
    def in_call(self) -> bool:
        return self._block is not None

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._block is None:
                i = buf.find(OPEN)
                if i >= 0:
                    self._text(buf[:i], out)
                    self._space_before, self._space = self._space, ""  # given back if the block is not a call
                    self._block = ""
                    buf = buf[i + len(OPEN) :]
                    continue
                keep = partial_suffix(buf, OPEN)
                self._text(buf[: len(buf) - keep], out)
                self._held = buf[len(buf) - keep :]
                return out
            start = max(0, len(self._block) - len(CLOSE) + 1)
            self._block += buf
            j = self._block.find(CLOSE, start)
            if j < 0:
                return out
            body, buf = self._block[:j], self._block[j + len(CLOSE) :]
            self._block = None
            self._close(body, out, OPEN + body + CLOSE)
        return out

    def flush(self, complete: bool = True) -> list[Piece]:
        """The end of the reply. `complete`: the model ended it (not max_tokens, a stop or a cancel)."""
        out: list[Piece] = []
        if self._block is not None:
            body, self._block = self._block, None
            if complete:
                self._close(body, out, OPEN + body)
            else:
                self._as_text(OPEN + body, out)
        self._text(self._held, out)
        self._held = ""
        if self._space and not self._after_call:
            out.append(self._space)
        self._space = ""
        return out

    def _close(self, body: str, out: list[Piece], raw: str) -> None:
        calls = _parse_block(body, self._schemas, self.new_id)
        if calls is None:
            self._as_text(raw, out)
            return
        self.calls.extend(calls)
        out.extend(calls)
        self._after_call = True

    def _as_text(self, raw: str, out: list[Piece]) -> None:
        self._space = self._space_before
        self._text(raw, out)

    def _text(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body) :]
        if self._after_call:
            body = body.lstrip()
        if body:
            self._after_call = False
            out.append(body)
