"""Whatever JSON a client sends as a tool's schema, reading the model's calls against it never raises: a schema
the parser cannot type leaves the value as the model wrote it (or the block as text)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from macapp.core.serving.requests import ToolCall, ToolSpec
from macapp.core.serving.toolcalls import ToolCallParser, _plain_type, parsing_schemas

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
schema_words = st.sampled_from(["type", "anyOf", "oneOf", "enum", "$ref", "properties", "items"])
schemas = st.recursive(
    st.dictionaries(schema_words, json_values, max_size=3),
    lambda inner: st.dictionaries(schema_words, inner | st.lists(inner, max_size=3) | json_values, max_size=3),
    max_leaves=12,
)

CALL = "<tool_call>\n<function=f>\n<parameter=x>\n3\n</parameter>\n</function>\n</tool_call>"


def test_a_type_list_holding_lists_has_no_single_type():
    assert _plain_type({"type": [["x"]]}) is None
    assert _plain_type({"type": [{"a": 1}, "null"]}) is None
    assert _plain_type({"anyOf": [{"type": [["x"]]}, {"type": "null"}]}) is None
    assert _plain_type({"type": ["integer", "null"]}) == "integer"


def test_the_issues_schema_parses_its_call():
    tool = ToolSpec("f", parameters={"type": "object", "properties": {"x": {"type": [["x"]]}}})
    parser = ToolCallParser([tool])
    pieces = parser.feed(CALL) + parser.flush()
    assert [p.name for p in pieces if isinstance(p, ToolCall)] == ["f"]


@settings(max_examples=300, deadline=None)
@given(properties=st.dictionaries(st.sampled_from(["x", "y"]), schemas | json_values, max_size=2), top=schemas)
def test_any_schema_is_read_without_raising(properties, top):
    tool = ToolSpec("f", parameters={**top, "properties": properties})
    parsing_schemas([tool])
    parser = ToolCallParser([tool])
    pieces = parser.feed(CALL) + parser.flush()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    text = "".join(p for p in pieces if isinstance(p, str))
    assert calls or CALL in text  # a call, or the block given back as the text the model wrote
