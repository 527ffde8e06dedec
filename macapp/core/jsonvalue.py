"""The one type of a JSON document as json.loads gives it (and json.dumps takes): for values read or built whole."""

from __future__ import annotations

from typing import TypeAlias, Union

JSONValue: TypeAlias = Union[None, bool, int, float, str, list["JSONValue"], dict[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]
