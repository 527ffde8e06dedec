"""Where a chat session keeps its prompt's saved positions beyond the process (the disk store, macapp.core.prompt_disk):
a front end gives the Engine a factory (`Engine.position_shelf`), so a conversation reopened after a restart
reads only what is new. The engine knows only this protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.options import KVQuantization
    from macapp.core.engine.positions import SavedPosition


class PositionShelf(Protocol):
    """Saved positions of one model (and KV setting), found by their tokens."""

    def lookup(self, tokens: Sequence[int | str], longer_than: int = 0) -> "SavedPosition | None":
        """The longest kept position whose tokens are a proper prefix of `tokens` (longer than `longer_than`)."""

    def put(self, position: "SavedPosition") -> bool:
        """Keep a detached position (written off the decode path); False when it is not kept."""


ShelfFactory = Callable[["LoadedModel", "KVQuantization"], "PositionShelf | None"]
