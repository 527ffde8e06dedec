"""The original repo with an MTP head and its MLX build without one, on the hub stand-in (tests/fixtures/mtp.py)."""

from tests.fixtures.mtp import build_folder, mtp_repos, served  # noqa: F401
