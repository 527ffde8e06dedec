"""What a history operation can fail with; every message is meant for people."""

from __future__ import annotations


class StoreError(Exception):
    """A history operation failed; the message is meant for people."""


class ReadOnlyStoreError(StoreError):
    """The history is open read-only (written by a newer app version)."""


class NotFoundError(StoreError):
    """No conversation (or message) with that id."""


class ImportFormatError(StoreError):
    """The data to import is not a conversation this app understands."""
