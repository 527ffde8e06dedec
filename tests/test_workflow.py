"""The GitHub Actions workflow, checked offline: GitHub's own schema (vendored in check-jsonschema) and what the
Mac job must prove (README's test command, the documented build, self-test, signature, DMG, artifacts)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
RELEASED_TAG = re.compile(r"^[\w.-]+/[\w.-]+@v\d+\.\d+\.\d+$")  # owner/action@vMAJOR.MINOR.PATCH


def check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is in the test extra (pip install -e '.[test]')"
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def all_steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def readme_test_command() -> str:
    block = ROOT.joinpath("README.md").read_text().split("## Two commands", 1)[1].split("```", 2)[1]
    line = next(line for line in block.splitlines() if "runs the whole test suite" in line)
    return line.split("#", 1)[0].strip()


def test_the_workflow_passes_githubs_schema():
    result = check_jsonschema(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "ci.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-24.04", "runs_on: ubuntu-24.04", 1))
    result = check_jsonschema(broken)
    assert result.returncode != 0
    assert "runs-on" in result.stdout + result.stderr


def test_every_action_is_pinned_to_a_released_version(workflow):
    uses = [step["uses"] for step in all_steps(workflow) if "uses" in step]
    assert uses, "the workflow uses actions"
    assert [u for u in uses if not RELEASED_TAG.match(u)] == []


def test_every_job_has_a_time_limit_well_under_the_runners(workflow):
    for name, job in workflow["jobs"].items():
        assert 0 < job["timeout-minutes"] <= 60, name


def test_the_mac_job_runs_on_apple_silicon_with_a_native_python(workflow):
    mac = workflow["jobs"]["macos"]
    assert mac["runs-on"] == "${{ matrix.os }}"
    oses = mac["strategy"]["matrix"]["os"]
    assert set(oses) == {"macos-14", "macos-15"}  # arm64 images (macos-13 is the last Intel one)
    setup = next(step for step in mac["steps"] if step.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["architecture"] == "arm64" and setup["with"]["cache"] == "pip"
    assert "platform.machine() != 'arm64'" in runs(mac)


def test_the_mac_job_proves_the_mac_path(workflow):
    mac = runs(workflow["jobs"]["macos"])
    assert readme_test_command() == "make test" and "\nmake test " in "\n" + mac
    assert "make dmg" in mac  # README's documented build command for the app and the DMG
    assert '"dist/Qwen Desk.app/Contents/MacOS/qwen-desk" --self-test' in mac
    assert 'codesign --verify --deep --strict --verbose=2 "dist/Qwen Desk.app"' in mac
    assert "hdiutil verify dist/*.dmg" in mac
    assert "python -m macapp.devtools.probe" in mac  # the real probe's readings go into the log
    upload = next(step for step in workflow["jobs"]["macos"]["steps"] if step.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    for artifact in ("dist/*.dmg", "selftest.log", "probe.log"):
        assert artifact in upload["with"]["path"]


def test_the_linux_job_runs_what_ci_runs_with_the_same_system_libraries(workflow):
    linux = workflow["jobs"]["linux"]
    assert "bash .ci/run" in runs(linux)
    assert "$(cat .ci/apt-packages.txt)" in runs(linux)
    assert "apt-packages.txt" in ROOT.joinpath(".ci", "run").read_text()  # one list for both
    packages = ROOT.joinpath(".ci", "apt-packages.txt").read_text().split()
    assert "fonts-dejavu-core" in packages and "libegl1" in packages


def test_the_lowest_job_tests_the_lower_bounds_pyproject_claims(workflow):
    """The lowest job runs `make test-lowest`, and every pin of its constraints file is a bound pyproject.toml states."""
    import tomllib

    assert "make test-lowest" in runs(workflow["jobs"]["lowest"])
    assert "-c .ci/lowest-constraints.txt" in ROOT.joinpath("Makefile").read_text()
    pins = {}
    for line in ROOT.joinpath(".ci", "lowest-constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    bounds = {}
    for requirement in tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())["project"]["dependencies"]:
        found = re.match(r"^([\w.-]+)(?:\[[\w,]+\])?\s*>=\s*([\w.]+)", requirement)
        assert found, f"{requirement}: no lower bound"
        bounds[found[1].lower().replace("_", "-")] = found[2]
    assert set(bounds) <= set(pins)  # every dependency's lower bound is installed by the lowest job
    for name, lowest in bounds.items():
        assert [int(p) for p in pins[name].split(".")] == [int(p) for p in lowest.split(".")] + [0] * (pins[name].count(".") - lowest.count("."))
