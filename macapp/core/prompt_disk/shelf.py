"""One model's place in the disk store: its fingerprint, its name, the layer kinds its cache has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from macapp.core.prompt_disk.fingerprint import fingerprint
from macapp.core.prompt_disk.store import DiskStore

if TYPE_CHECKING:
    from macapp.core.engine.positions import SavedPosition
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.options import KVQuantization


@dataclass(frozen=True)
class ModelShelf:
    """The disk store as one loaded model (and KV setting) sees it. Worker thread."""

    store: DiskStore
    fingerprint: str
    model: str
    classes: tuple[type, ...]  # a fresh cache's layer classes: a file of another layout is not this model's

    @classmethod
    def of(cls, store: DiskStore, m: "LoadedModel", kv: "KVQuantization") -> "ModelShelf":
        from mlx_lm.models.cache import make_prompt_cache

        return cls(store, fingerprint(m, kv), m.path.name, tuple(type(c) for c in make_prompt_cache(m.model)))

    def lookup(self, tokens: Sequence[int | str], longer_than: int = 0) -> "SavedPosition | None":
        return self.store.lookup(self.fingerprint, tokens, self.classes, longer_than)

    def put(self, checkpoint: "SavedPosition") -> bool:
        return self.store.put(self.fingerprint, self.model, checkpoint)


def shelves(store: DiskStore) -> Callable[["LoadedModel", "KVQuantization"], ModelShelf | None]:
    """The Engine's `position_shelf` factory for `store` (engine/shelf.py): each model's shelf, none when off."""

    def shelf(m: "LoadedModel", kv: "KVQuantization") -> ModelShelf | None:
        return ModelShelf.of(store, m, kv) if store.max_bytes else None

    return shelf
