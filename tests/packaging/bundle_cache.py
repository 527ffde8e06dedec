"""The Linux one-folder bundle that tests/packaging/test_bundle.py checks: built with the real spec into
build/test-bundle/ (ignored by git), and built again only when something it is built from changed (`inputs`):
PyInstaller took 90 s even when it found nothing changed.

`make test` starts `python -m tests.packaging.bundle_cache` in the background before the linters, so the build (about
two minutes on 2 cores) runs beside them, on the core mypy leaves idle; the tests' fixture calls `ensure()`, which waits
for that build (a file lock) and finds it done, or builds itself when nothing started one.

Into build/, not pytest's temp folder: other pytest runs on a shared machine prune old temp folders, and PyInstaller
reuses its work folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "test-bundle"
DIST, WORK = OUT / "dist", OUT / "work"
BUNDLE = DIST / "qwen-desk"
STAMP = OUT / "built-from.json"
SOURCES = ("macapp", "resources", "packaging", "pyproject.toml", "setup.py")


class BuildFailed(Exception):
    """build.py failed: its output's tail."""


def inputs(root: Path = ROOT) -> str:
    """A digest of what the bundle is built from: every file the spec can pack or read under `root` (compiled
    caches aside), and the Python and installed distributions (name and version) it packs them with."""
    digest = hashlib.sha256(f"{sys.executable}\n{sys.version}\n".encode())
    for line in sorted({f"{dist.metadata['Name']}=={dist.version}" for dist in metadata.distributions()}):
        digest.update(line.encode() + b"\n")
    for name in SOURCES:
        top = root / name
        files = sorted(p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if top.is_dir() else [top]
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def files(bundle: Path) -> str:
    """A digest of the bundle's files (names and sizes): a reused bundle is the one that was built, nothing added."""
    listing = sorted((p.relative_to(bundle).as_posix(), p.lstat().st_size) for p in bundle.rglob("*")) if bundle.is_dir() else []
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def ensure() -> Path:
    """The bundle, built from what is here now: the one already built if nothing changed, else a new build."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a build already running (make test's, another run's) is waited for
        built_from = {"inputs": inputs()}
        if STAMP.exists() and json.loads(STAMP.read_text()) == {**built_from, "files": files(BUNDLE)}:
            return BUNDLE
        STAMP.unlink(missing_ok=True)
        result = subprocess.run(
            ["nice", "-n", "10", sys.executable, str(ROOT / "packaging" / "build.py"), "--dist", str(DIST), "--work", str(WORK)],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if result.returncode != 0:
            raise BuildFailed(result.stdout[-3000:] + result.stderr[-3000:])
        STAMP.write_text(json.dumps({**built_from, "files": files(BUNDLE)}))
    return BUNDLE


def main() -> int:
    if not sys.platform.startswith("linux"):  # on a Mac the bundle is the .app, built by `make dmg`
        return 0
    try:
        ensure()
    except BuildFailed as exc:  # the fixture builds again and shows the output
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
