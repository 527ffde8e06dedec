"""A prompt cache as mlx-lm builds it: one layer object per model layer (KVCache, ArraysCache, QuantizedKVCache).

mlx-lm's layer classes share no typed interface (`offset`, `keys`, `cache` live on some of them only), so the
layers are duck-typed here; the list is the engine's, the vision runner's and the ranks' common currency.
No MLX import: naming the type costs nothing at start-up.
"""

from __future__ import annotations

from typing import Any

CacheLayers = list[Any]
