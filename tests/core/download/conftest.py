"""The stand-in hub serving one small two-shard MLX repo (tests/fixtures/hub.py)."""

from __future__ import annotations

import pytest

from tests.fixtures.downloads import REPO
from tests.fixtures.hub import random_repo_files


@pytest.fixture
def repo(hub_server):
    return hub_server.add_repo(REPO, random_repo_files())
