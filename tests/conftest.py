"""Shared fixtures. Each area keeps its fixtures in tests/fixtures/ and they are loaded here."""

from __future__ import annotations

import os

# Before anything imports Qt, MLX or huggingface_hub.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("MLX_DISABLE_COMPILE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import mlx.core as mx  # noqa: E402

# Compiled here, not in the processes the tests start (they inherit MLX_DISABLE_COMPILE=1 and start fast): the
# tiny models' DeltaNet reads a prompt one step per token, and mlx-lm's compiled step is ~2.5x faster on the CPU.
mx.enable_compile()

# huggingface_hub freezes HF_HOME/HF_HUB_OFFLINE at import: point its defaults at a throwaway folder, never the
# user's real cache, and import it now so no test's monkeypatched environment gets frozen in by accident.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="qwen-desk-tests-hf-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)  # this process's own: nothing left in /tmp
import huggingface_hub.constants  # noqa: E402,F401  fix its import-time constants now (the app reads HF_* at call time)
import pytest

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.hub",
    "tests.fixtures.scripted",
    "tests.fixtures.mcp_servers",
]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Every test gets its own app home and HF cache, so nothing touches the user's real data."""
    home = tmp_path_factory.mktemp("qwen_desk_home")
    monkeypatch.setenv("QWEN_DESK_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    yield home


# The longest test files first: `make test` runs `-n 2 --dist loadfile`, whose workers take files in collection
# order, so one worker builds the bundle (minutes) while the other runs the rest, instead of the build starting
# last and running alone at the end. Measured with `--durations` (issue #34: the bundle build took 253 s of 12.7 min).
LONGEST_FIRST = ("tests/packaging/test_bundle.py",)


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}

    def order(item) -> int:
        relative = item.path.relative_to(config.rootpath).as_posix()
        return rank.get(relative, len(rank))

    items.sort(key=order)  # stable: the rest keep their order
