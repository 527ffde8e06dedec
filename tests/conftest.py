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
from collections import Counter  # noqa: E402

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
from hypothesis import HealthCheck, settings

# Hypothesis times how fast its examples are generated and fails a test whose generation is slow: on 2 cores shared
# with another suite that says nothing about the code. The tests set deadline=None themselves.
settings.register_profile("shared-cores", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")

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


# The longest test files first, then the rest by their number of tests, most first: `make test` runs `-n 2 --dist
# loadfile --no-loadscope-reorder`, whose two workers take whole files in this order, so the long ones run side by
# side from the start and the short ones even out the end (a long file started last runs alone while the other worker
# idles; pytest-xdist's own order, by number of tests, put the bundle 19th and the agents' replays near the end).
# Seconds: each file alone (-n 0), niced, on the 2-core VM beside other work (testtime branch, 2026-12-06); a file
# that takes more than about 15 s alone belongs here.
LONGEST_FIRST = (
    "tests/packaging/test_bundle.py",  # 155 from a fresh clone (its bundle build 124, started by make test); 9 reused
    "tests/core/cluster/test_launch.py",  # 50
    "tests/cli/test_chat_cluster.py",  # 45
    "tests/server/test_anthropic_clients.py",  # 40
    "tests/ui/test_library.py",  # 36
    "tests/ui/test_chat.py",  # 33
    "tests/server/test_claude_code_requests.py",  # 29
    "tests/server/test_bad_input_http.py",  # 27
    "tests/core/tools/test_loop.py",  # 25
    "tests/core/test_long_context.py",  # 22
    "tests/cli/test_prompt_cache_cli.py",  # 21
    "tests/server/test_qwen_code_requests.py",  # 20
    "tests/core/cluster/test_lockstep.py",  # 19
    "tests/cli/test_serve_cluster.py",  # 15
    "tests/core/download/test_manager.py",  # 15
    "tests/core/test_long_context_reference.py",  # 14
    "tests/ui/test_tools_window.py",  # 14
)


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    tests_in = Counter(item.path for item in items)

    def order(item) -> tuple[int, int]:
        relative = item.path.relative_to(config.rootpath).as_posix()
        return rank.get(relative, len(rank)), -tests_in[item.path]

    items.sort(key=order)  # stable: a file's tests stay together and in their order
