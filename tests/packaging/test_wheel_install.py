"""`pip install .` (not editable) must give a working app: build the wheel, install it into a fresh venv, run it.

The fresh venv gets only the wheel (`--no-deps`); its dependencies come from this test's own environment
through a .pth line, so the check needs no network and takes seconds. The .venv's editable-install hook is a
.pth file itself, which a .pth *line* does not execute, so `macapp` can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ("catalog.json", "icon.png", "style.qss", "Info.plist")


def _setuptools_builds_wheels_offline() -> bool:
    """setuptools ≥ 77 carries bdist_wheel and reads the SPDX `license` string: the wheel builds without fetching a backend."""
    try:
        major, minor = (int(part) for part in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (77, 0)


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, **kwargs)
    assert result.returncode == 0, f"{' '.join(command)} → {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(the wheel, the fresh venv's bin folder, an environment for running it)."""
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: an in-tree build leaves build/lib behind, whose stale files would go into later wheels.
    source = work / "source"
    for folder in ("macapp", "resources"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    isolation = ["--no-build-isolation"] if _setuptools_builds_wheels_offline() else []
    (work / "tmp").mkdir()
    pip_env = {**os.environ, "TMPDIR": str(work / "tmp")}  # pip's scratch folders stay in this test's folder
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(work / "dist"), str(source)], env=pip_env)
    wheel = next((work / "dist").glob("qwen_desk-*.whl"))
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], env=pip_env)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {**os.environ, "QWEN_DESK_HOME": str(work / "home"), "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    return wheel, venv / "bin", env


def test_the_wheel_carries_the_built_in_data(wheel_install):
    """The top-level resources/ folder travels inside the wheel as macapp/resources, byte for byte."""
    wheel, _bin, _env = wheel_install
    with zipfile.ZipFile(wheel) as archive:
        for name in RESOURCES:
            assert archive.read(f"macapp/resources/{name}") == (ROOT / "resources" / name).read_bytes()


def test_the_wheel_states_its_license_as_an_spdx_expression(wheel_install):
    wheel, _bin, _env = wheel_install
    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read(next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert not any(line.startswith("License: ") for line in meta.splitlines())  # the deprecated table form


def test_a_wheel_install_reads_its_own_catalog(wheel_install, tmp_path):
    _wheel, bin_dir, env = wheel_install
    probe = "from macapp.core import catalog, paths; print(paths.resources_dir()); print(len(catalog.load_catalog()))"
    where, rows = _run([str(bin_dir / "python"), "-c", probe], env=env, cwd=tmp_path).stdout.split()
    assert Path(where).is_relative_to(bin_dir.parent), where  # the wheel's copy, not the checkout's resources/
    assert int(rows) == len(json.loads((ROOT / "resources" / "catalog.json").read_text())["models"])


def test_the_wheel_carries_the_demo_and_no_developer_tools(wheel_install):
    wheel, _bin, _env = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    assert {"macapp/core/demo/model.py", "macapp/core/demo/tiny_model.py", "macapp/core/demo/tiny_vlm.py", "macapp/cli/selftest.py"} <= set(names)
    assert [n for n in names if n.startswith("macapp/devtools/")] == []  # screenshots and the probe run from a checkout


@pytest.mark.slow
def test_a_wheel_install_runs_models_and_the_self_test(wheel_install, tmp_path):
    _wheel, bin_dir, env = wheel_install
    where = _run([str(bin_dir / "python"), "-c", "import macapp; print(macapp.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent), where.stdout  # the wheel's copy, not the checkout

    models = _run([str(bin_dir / "qwen-desk"), "models"], env=env, cwd=tmp_path)
    assert "Qwen3.5-35B-A3B" in models.stdout

    self_test = _run([str(bin_dir / "qwen-desk"), "--self-test"], env=env, cwd=tmp_path)
    assert "PASS: 8/8 checks" in self_test.stdout, self_test.stdout
    assert str(bin_dir.parent) in self_test.stdout  # it reports the installed package as its source
