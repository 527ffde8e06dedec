"""The streaming tool-call parser: the same result however the text is split into pieces."""

from __future__ import annotations

import itertools
import random

import pytest

from macapp.core.serving.requests import ToolCall, ToolSpec
from macapp.core.serving.toolcalls import ToolCallParser, parse_block

WEATHER = ToolSpec(
    "get_weather",
    "forecast",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "hours": {"type": "array"},
            "scale": {"type": "number"},
        },
    },
)
TIME = ToolSpec("get_time", "", {"type": "object", "properties": {"city": {"type": "string"}}})
TOOLS = (WEATHER, TIME)


def call(name: str, args: str) -> str:
    return f"<tool_call>\n<function={name}>\n{args}</function>\n</tool_call>"


def param(name: str, value: str) -> str:
    return f"<parameter={name}>\n{value}\n</parameter>\n"


PARIS = call("get_weather", param("city", "Paris") + param("days", "3"))

# (reply text, expected pieces: str for answer text, (name, arguments) for a call)
CASES = [
    ("Just text, no call.", ["Just text, no call."]),
    ("a < b and <tool and <tool_cal are text", ["a < b and <tool and <tool_cal are text"]),
    ("Ends with a half tag <tool_c", ["Ends with a half tag <tool_c"]),
    (PARIS, [("get_weather", {"city": "Paris", "days": 3})]),
    ("I will check.\n\n" + PARIS, ["I will check.", ("get_weather", {"city": "Paris", "days": 3})]),
    (
        call("get_weather", param("city", "New\nYork") + param("metric", "true") + param("hours", "[1, 2]") + param("scale", "1.5")),
        [("get_weather", {"city": "New\nYork", "metric": True, "hours": [1, 2], "scale": 1.5})],
    ),
    (
        PARIS + "\n" + call("get_time", param("city", "Rome")),
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"city": "Rome"})],
    ),
    (  # two functions in one block
        "<tool_call>\n<function=get_time>\n"
        + param("city", "Rome")
        + "</function>\n<function=get_weather>\n"
        + param("city", "Oslo")
        + "</function>\n</tool_call>",
        [("get_time", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})],
    ),
    (  # a tool the request did not offer: still a call (the client answers it), values untyped
        call("search", param("q", "mlx") + param("n", "5")),
        [("search", {"q": "mlx", "n": "5"})],
    ),
    (PARIS + "\n\nDone.", [("get_weather", {"city": "Paris", "days": 3}), "Done."]),
    ("<tool_call>\nnot a call\n</tool_call>", ["<tool_call>\nnot a call\n</tool_call>"]),
    (  # no ">" after the name
        "Calling:<tool_call>\n<function=get_weather\n<parameter=city>\nOslo\n</tool_call>",
        ["Calling:<tool_call>\n<function=get_weather\n<parameter=city>\nOslo\n</tool_call>"],
    ),
    (  # an integer that is not one
        "x " + call("get_weather", param("days", "3.5")),
        ["x " + call("get_weather", param("days", "3.5"))],
    ),
    (  # stray text between functions
        "<tool_call>\n<function=get_time>\n</function>\nhmm\n<function=get_time>\n</function>\n</tool_call>",
        ["<tool_call>\n<function=get_time>\n</function>\nhmm\n<function=get_time>\n</function>\n</tool_call>"],
    ),
    (  # text between the parameters (here a second call begun inside the first)
        "<tool_call>\n<function=get_time>\nhmm <tool_call>\n<function=get_time>\n" + param("city", "Rome") + "</function>\n</tool_call>",
        ["<tool_call>\n<function=get_time>\nhmm <tool_call>\n<function=get_time>\n" + param("city", "Rome") + "</function>\n</tool_call>"],
    ),
    (  # the model ended without </tool_call>, its function complete: accepted
        "<tool_call>\n<function=get_time>\n" + param("city", "Rome") + "</function>\n",
        [("get_time", {"city": "Rome"})],
    ),
    ("<tool_call>\n<function=get_time>\n<parameter=ci", ["<tool_call>\n<function=get_time>\n<parameter=ci"]),
    (
        "Text then a good call " + PARIS + " and a bad one <tool_call>oops</tool_call>",
        [
            "Text then a good call",
            ("get_weather", {"city": "Paris", "days": 3}),
            "and a bad one <tool_call>oops</tool_call>",
        ],
    ),
]


def normalise(pieces: list) -> list:
    out: list = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            out.append((piece.name, piece.arguments))
        elif out and isinstance(out[-1], str):
            out[-1] += piece
        else:
            out.append(piece)
    return out


def run(chunks: list[str], complete: bool = True) -> list:
    parser = ToolCallParser(TOOLS)
    pieces: list = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    pieces += parser.flush(complete)
    return pieces


def splits(text: str):
    yield [text]
    yield list(text)
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        yield [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


@pytest.mark.parametrize("text,expected", CASES)
def test_any_split_gives_the_same_pieces(text, expected):
    for chunks in splits(text):
        assert normalise(run(chunks)) == expected, chunks


@pytest.mark.parametrize("text,_", CASES)
def test_nothing_is_lost_nor_invented(text, _):
    """Every character comes back as text, or inside a call (the format's own whitespace aside)."""
    pieces = run(list(text))
    text_out = "".join(p for p in pieces if isinstance(p, str))
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    if not calls:
        assert text_out == text
    for piece in pieces:
        if isinstance(piece, str):
            assert piece in text
        else:
            assert f"<function={piece.name}>" in text


def test_text_before_a_call_streams_before_the_call_ends():
    parser = ToolCallParser(TOOLS)
    assert parser.feed("Let me look") == ["Let me look"]
    assert parser.feed(" it up. <tool") == [" it up."]
    assert parser.feed("_call>\n<function=get_time>\n") == []
    assert parser.in_call
    out = parser.feed(param("city", "Rome") + "</function>\n</tool_call>")
    assert [(c.name, c.arguments) for c in out] == [("get_time", {"city": "Rome"})]
    assert parser.flush() == []


def test_a_call_cut_short_comes_back_as_text():
    text = "<tool_call>\n<function=get_time>\n" + param("city", "Rome") + "</function>\n"
    assert normalise(run([text], complete=False)) == [text]


def test_calls_get_distinct_ids():
    ids = iter(["call_a", "call_b"])
    parser = ToolCallParser(TOOLS, new_id=lambda: next(ids))
    out = parser.feed(PARIS + call("get_time", param("city", "Rome")))
    assert [c.id for c in out] == ["call_a", "call_b"] and parser.calls == out


def test_parse_block_refuses_empty_and_garbage():
    assert parse_block("", TOOLS) is None
    assert parse_block("\n<function=>\n</function>\n", TOOLS) is None
    assert parse_block("\n<function=get_time>\n</function>\n", TOOLS)[0].arguments == {}


def _one(params: str, properties: dict) -> dict:
    tool = ToolSpec("f", "", {"type": "object", "properties": properties})
    (call,) = parse_block(f"\n<function=f>\n{params}</function>\n", [tool])
    return call.arguments


def test_values_are_typed_by_optional_and_union_schemas_too():
    """What clients send: pydantic's Optional (anyOf with null), strict OpenAI type lists, $ref objects, enums."""
    p = '<parameter=n>\n3\n</parameter>\n<parameter=s>\n123\n</parameter>\n<parameter=o>\n{"a": 1}\n</parameter>\n<parameter=e>\n1\n</parameter>\n'
    args = _one(
        p,
        {
            "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "s": {"type": ["string", "null"]},
            "o": {"$ref": "#/$defs/Thing"},
            "e": {"enum": ["1", "2"]},
        },
    )
    assert args == {"n": 3, "s": "123", "o": {"a": 1}, "e": "1"}
    assert _one("<parameter=n>\n2.5\n</parameter>\n", {"n": {"type": ["number", "null"]}}) == {"n": 2.5}
    assert _one("<parameter=x>\n7\n</parameter>\n", {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}) == {"x": "7"}  # no single type: as before


def test_the_markers_are_mlx_lms_own():
    """OPEN and CLOSE are written out (mlx-lm loads MLX, which the window must not import at its start)."""
    from mlx_lm.tool_parsers import qwen3_coder

    from macapp.core.serving import toolcalls

    assert (toolcalls.OPEN, toolcalls.CLOSE) == (qwen3_coder.tool_call_start, qwen3_coder.tool_call_end)
