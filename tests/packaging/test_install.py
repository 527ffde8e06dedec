"""`make run` installs the app alone (its own dependencies, pip's progress shown); `make test` adds the test tools
and the reference torch; pyproject's license is an SPDX string that setuptools reads without warnings."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def recipe(target: str) -> tuple[str, list[str]]:
    """(the prerequisites, the command lines) of a Makefile rule, variables left as written."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n?)*)", text, re.MULTILINE)
    assert match, f"no rule for {target} in the Makefile"
    return match[1].strip(), [line.strip() for line in match[2].splitlines()]


def pip_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line]


def test_make_run_installs_the_app_alone_with_pips_progress_shown():
    needs, _ = recipe("run")
    assert needs == "$(APP_STAMP)"
    _, lines = recipe("$(APP_STAMP)")
    installs = pip_lines(lines)
    assert "$(BIN)/pip install -e ." in installs
    assert not any("[test" in line or "torch" in line for line in installs), installs
    assert not any(re.search(r"\s(-q|--quiet)\b", line) for line in installs), installs


def test_make_test_adds_the_test_extras_and_the_reference_torch_on_top():
    needs, _ = recipe("test")
    assert needs == "$(STAMP)"
    stamp_needs, lines = recipe("$(STAMP)")
    assert stamp_needs == "$(APP_STAMP)"
    installs = pip_lines(lines)
    assert any('-e ".[test,package]"' in line for line in installs)
    assert any("--target $(VENV)/torch-reference torch==" in line for line in installs)
    assert not any(re.search(r"\s(-q|--quiet)\b", line) for line in installs), installs


def _closure(name: str, extras: frozenset[str] = frozenset(), seen: set[str] | None = None) -> set[str]:
    """Every distribution `name[extras]` pulls in, as installed here, markers evaluated for this platform."""
    seen = set() if seen is None else seen
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return seen
    seen.add(key)
    for line in metadata.requires(name) or []:
        requirement = Requirement(line)
        wanted = requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in extras or {""})
        if wanted:
            _closure(requirement.name, frozenset(requirement.extras), seen)
    return seen


def test_the_apps_own_dependencies_pull_in_no_torch_and_no_test_tools():
    app = _closure("qwen-desk")
    assert {"mlx-lm", "mlx-vlm", "pyside6-essentials", "starlette"} <= app
    assert not app & {"torch", "pytest", "ruff", "mypy", "pyinstaller"}, sorted(app)


def test_the_license_is_an_spdx_expression_setuptools_reads():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]  # PEP 639 license strings
    # what a built wheel's METADATA says: tests/packaging/test_wheel_install.py


def test_make_test_hands_out_the_longest_files_first_and_starts_the_bundle_build_beside_the_linters():
    from tests.conftest import LONGEST_FIRST

    _, lines = recipe("test")
    assert "--no-loadscope-reorder" in (ROOT / "Makefile").read_text() and any("$(PYTEST_DIST)" in line for line in lines)
    assert [path for path in LONGEST_FIRST if not (ROOT / path).is_file()] == []  # a renamed file would silently drop out
    assert "tests.packaging.bundle_cache" in lines[0] and lines[0].rstrip(")").endswith("&")  # before ruff, in the background
