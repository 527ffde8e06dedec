"""A picture as the history refers to it (macapp.core.picture_data, where it lives with the other plain picture
records; named here too for the modules that know it as vision.refs)."""

from macapp.core.picture_data import ImageRef, refs_from_json, refs_to_json

__all__ = ["ImageRef", "refs_from_json", "refs_to_json"]
