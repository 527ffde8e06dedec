"""Build Qwen Desk for the platform this runs on: `make app` (and `make dmg` on a Mac).

    python packaging/build.py                 # dist/Qwen Desk.app on macOS, dist/qwen-desk/ on Linux
    python packaging/build.py --self-test     # ... then run the bundle's own --self-test
    python packaging/build.py --dmg           # macOS: dist/Qwen-Desk-<version>.dmg (builds the app if missing)
    python packaging/build.py --dmg --sign "Developer ID Application: Name (TEAMID)" --notarize PROFILE

The decisions (Info.plist contents, PyInstaller, codesign, hdiutil and notarytool command lines) are
small functions that return values, so they are tested on Linux; only `main` runs macOS tools.
This file is also loaded by qwen_desk.spec for the names and lists below. It is loaded by path, never
imported as `packaging.build`: a top-level `packaging` package would shadow the PyPI one.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC_PATH = ROOT / "packaging" / "qwen_desk.spec"
INFO_PLIST_TEMPLATE = ROOT / "resources" / "Info.plist"
ENTITLEMENTS_PATH = ROOT / "packaging" / "entitlements.plist"
ICON_PNG = ROOT / "resources" / "icon.png"
ICON_ICNS = ROOT / "resources" / "icon.icns"

APP_NAME = "Qwen Desk"
EXE_NAME = "qwen-desk"  # the executable, and the one-folder bundle's name on Linux
BUNDLE_ID = "dev.qwendesk.QwenDesk"
VERSION_PLACEHOLDER = "@VERSION@"

# Environment variables the spec reads (PyInstaller runs the spec in its own process).
ENV_CODESIGN_IDENTITY = "QWEN_DESK_CODESIGN_IDENTITY"
ENV_ENTITLEMENTS = "QWEN_DESK_ENTITLEMENTS"

# The Qt modules the app uses; every other PySide6 module is excluded to keep the bundle small.
QT_MODULES_USED = ("QtCore", "QtGui", "QtWidgets")

# Never needed at run time, and large when present in the build environment.
EXCLUDED_MODULES = (
    "torch",
    "torchvision",
    "tensorflow",
    "jax",
    "flax",
    "keras",
    "IPython",
    "matplotlib",
    "pandas",
    "scipy",
    "sklearn",
    "tkinter",
    "_tkinter",
    "pytest",
    "_pytest",
    "pytestqt",
    "importlinter",
    "grimp",
    "PyInstaller",
    "setuptools",
    "pip",
    "mlx_lm.evaluate",
    "mlx_lm.examples",
    "sentencepiece",  # Qwen tokenizers are byte-level BPE (tokenizers)
    "huggingface_hub.cli",
    "transformers.pipelines",
    "transformers.trainer",
    "transformers.training_args",
    "transformers.data",
    "transformers.cli",
    # mlx-vlm's dependencies that pictures never use (video, audio, datasets, training): ~400 MB if bundled
    "cv2",
    "pyarrow",
    "datasets",
    "dill",
    "multiprocess",
    "xxhash",
    "mlx_audio",
    "miniaudio",
    "sounddevice",
    # not cryptography: the MCP client imports it (mcp.server.request_state), and the chat imports the MCP client
    "mlx_vlm.server",
    "mlx_vlm.evals",
    # The checkout's tests (only DEV_ONLY_MODULES import their fixtures) and what they bring
    "tests",
    "hypothesis",
)

# Developer tools that only run from a checkout (they import its tests' fixtures): not collected into the bundle.
# Following them cost about a fifth of the build's time.
DEV_ONLY_MODULES = ("macapp.devtools.screenshots", "macapp.devtools.screenshots_newcomer", "macapp.devtools.doc_outputs")

# transformers resolves tokenizer and config classes by name at run time (AutoTokenizer, AutoConfig):
# the Qwen families' configuration and tokenization modules must be collected explicitly. Its other ~550
# model packages (2,000+ modules, 20 MB) are excluded: the app only ever loads Qwen tokenizers and configs.
TRANSFORMERS_MODEL_PACKAGES = ("qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
TRANSFORMERS_SUPPORT_PACKAGES = ("auto", "encoder_decoder")
# Pictures: mlx-vlm imports its model package by model_type and the Qwen-VL processor by name; only these of its
# ~40 model families are bundled (PIL comes with them; opencv, scipy and pandas stay out: video only).
VISION_PACKAGES = ("mlx_vlm.models.qwen3_5", "mlx_vlm.models.qwen3_5_moe", "mlx_vlm.models.qwen3_vl")
VISION_MODULES = ("mlx_vlm", "mlx_vlm.utils", "mlx_vlm.prompt_utils", "mlx_vlm.models.cache", "mlx_vlm.models.base", "PIL.Image")


class BuildError(Exception):
    """A build step that cannot go on; printed as one line, exit status 2."""


# ---------------------------------------------------------------- version and Info.plist


def project_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """`[project] version` from pyproject.toml."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the one line we need, without a TOML library
        match = re.search(r'(?ms)^\[project\].*?^version\s*=\s*"([^"]+)"', text)
        if not match:
            raise BuildError(f"no [project] version in {pyproject}")
        return match.group(1)
    version = tomllib.loads(text).get("project", {}).get("version")
    if not version:
        raise BuildError(f"no [project] version in {pyproject}")
    return str(version)


def render_info_plist(version: str, template: Path = INFO_PLIST_TEMPLATE) -> dict:
    """The Info.plist values for BUNDLE: the template with @VERSION@ filled in."""
    with template.open("rb") as fh:
        values = plistlib.load(fh)

    def fill(value):
        if isinstance(value, str):
            return value.replace(VERSION_PLACEHOLDER, version)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value

    rendered = fill(values)
    leftover = [k for k, v in rendered.items() if isinstance(v, str) and re.search(r"@[A-Z_]+@", v)]
    if leftover:
        raise BuildError(f"unfilled placeholders in {template.name}: {', '.join(leftover)}")
    return rendered


# ---------------------------------------------------------------- what to collect (used by the spec)


def unused_qt_modules(pyside_dir: Path | None = None) -> list[str]:
    """`PySide6.QtX` names installed but not used by the app, for Analysis(excludes=...)."""
    if pyside_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("PySide6")
        if spec is None or not spec.submodule_search_locations:
            return []
        pyside_dir = Path(next(iter(spec.submodule_search_locations)))
    names = set()
    for path in pyside_dir.iterdir():
        stem = path.name.split(".", 1)[0]
        if stem.startswith("Qt") and path.suffix in (".so", ".pyd", ".pyi") and stem not in QT_MODULES_USED:
            names.add(f"PySide6.{stem}")
    return sorted(names)


def _transformers_models_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def transformers_hidden_imports(models_dir: Path | None = None) -> list[str]:
    """The transformers modules that AutoConfig/AutoTokenizer import by name for the Qwen families (those installed)."""
    models_dir = models_dir or _transformers_models_dir()
    if models_dir is None:
        return []
    modules = ["transformers.models.auto.tokenization_auto", "transformers.models.auto.configuration_auto"]
    for package in TRANSFORMERS_MODEL_PACKAGES:
        if not (models_dir / package).is_dir():
            continue
        modules.append(f"transformers.models.{package}")
        for kind in ("configuration", "tokenization"):
            if (models_dir / package / f"{kind}_{package}.py").exists():
                modules.append(f"transformers.models.{package}.{kind}_{package}")
    return modules


def transformers_model_excludes(models_dir: Path | None = None) -> list[str]:
    """Every `transformers.models.X` package except the Qwen ones and the auto machinery."""
    models_dir = models_dir or _transformers_models_dir()
    if models_dir is None:
        return []
    keep = set(TRANSFORMERS_MODEL_PACKAGES) | set(TRANSFORMERS_SUPPORT_PACKAGES)
    return sorted(
        f"transformers.models.{path.name}" for path in models_dir.iterdir() if path.is_dir() and not path.name.startswith("_") and path.name not in keep
    )


# ---------------------------------------------------------------- where things land


def bundle_path(dist: Path, platform: str = sys.platform) -> Path:
    """What the build produces: the .app on macOS, the one-folder bundle elsewhere."""
    return dist / f"{APP_NAME}.app" if platform == "darwin" else dist / EXE_NAME


def executable_path(dist: Path, platform: str = sys.platform) -> Path:
    if platform == "darwin":
        return bundle_path(dist, platform) / "Contents" / "MacOS" / EXE_NAME
    return bundle_path(dist, platform) / EXE_NAME


def dmg_path(dist: Path, version: str) -> Path:
    return dist / f"{APP_NAME.replace(' ', '-')}-{version}.dmg"


# ---------------------------------------------------------------- command lines


def pyinstaller_command(dist: Path, work: Path, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        str(dist),
        "--workpath",
        str(work),
        str(SPEC_PATH),
    ]


def pyinstaller_env(identity: str | None, entitlements: Path | None, base: dict | None = None) -> dict:
    """The environment for PyInstaller: the signing choices the spec reads."""
    env = dict(os.environ if base is None else base)
    env.pop(ENV_CODESIGN_IDENTITY, None)
    env.pop(ENV_ENTITLEMENTS, None)
    if identity and identity != "-":
        env[ENV_CODESIGN_IDENTITY] = identity
        env[ENV_ENTITLEMENTS] = str(entitlements or ENTITLEMENTS_PATH)
    return env


def codesign_verify_command(app: Path) -> list[str]:
    return ["codesign", "--verify", "--deep", "--strict", "--verbose=2", str(app)]


def codesign_dmg_command(dmg: Path, identity: str) -> list[str]:
    return ["codesign", "--force", "--timestamp", "--sign", identity, str(dmg)]


def hdiutil_command(staging: Path, dmg: Path, volume_name: str = APP_NAME) -> list[str]:
    """A compressed (UDZO), read-only DMG of the staging folder (the app and an Applications link)."""
    return [
        "hdiutil",
        "create",
        "-volname",
        volume_name,
        "-srcfolder",
        str(staging),
        "-fs",
        "HFS+",
        "-format",
        "UDZO",
        "-imagekey",
        "zlib-level=9",
        "-ov",
        str(dmg),
    ]


def notarize_commands(dmg: Path, keychain_profile: str) -> list[list[str]]:
    """Submit to Apple's notary service, wait for the verdict, then staple the ticket to the DMG."""
    return [
        ["xcrun", "notarytool", "submit", str(dmg), "--keychain-profile", keychain_profile, "--wait"],
        ["xcrun", "stapler", "staple", str(dmg)],
        ["spctl", "--assess", "--type", "open", "--context", "context:primary-signature", "--verbose", str(dmg)],
    ]


def stage_dmg_folder(app: Path, staging: Path) -> Path:
    """Lay out what the DMG window shows: the app (symlinks kept, as its signature needs) and /Applications."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    shutil.copytree(app, staging / app.name, symlinks=True)
    (staging / "Applications").symlink_to("/Applications")
    return staging


# ---------------------------------------------------------------- running


def _run(cmd: list[str], **kwargs) -> None:
    print("+ " + " ".join(f'"{c}"' if " " in c else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def build_app(dist: Path, work: Path, identity: str | None = None, entitlements: Path | None = None) -> Path:
    """Run PyInstaller on the spec; return the bundle it made."""
    if not ICON_PNG.exists():
        raise BuildError(f"missing {ICON_PNG.relative_to(ROOT)}: run packaging/make_icon.py")
    started = time.monotonic()
    _run(pyinstaller_command(dist, work), cwd=ROOT, env=pyinstaller_env(identity, entitlements))
    bundle = bundle_path(dist)
    if not executable_path(dist).exists():
        raise BuildError(f"PyInstaller finished but {executable_path(dist)} is missing")
    print(f"built {bundle} in {time.monotonic() - started:.0f} s ({folder_size(bundle) / 1e6:.0f} MB)")
    if sys.platform == "darwin":
        _run(codesign_verify_command(bundle))
    return bundle


def build_dmg(dist: Path, version: str, identity: str | None = None, notary_profile: str | None = None) -> Path:
    if sys.platform != "darwin":
        raise BuildError(f"a DMG needs macOS (hdiutil, codesign); on {sys.platform}, `make app` builds the one-folder bundle {bundle_path(dist)}/ instead")
    app = bundle_path(dist)
    dmg = dmg_path(dist, version)
    with tempfile.TemporaryDirectory(prefix="qwen-desk-dmg-") as tmp:
        staging = stage_dmg_folder(app, Path(tmp) / APP_NAME)
        _run(hdiutil_command(staging, dmg))
    if identity and identity != "-":
        _run(codesign_dmg_command(dmg, identity))
    if notary_profile:
        if not identity or identity == "-":
            raise BuildError("notarization needs a Developer ID signature: pass --sign 'Developer ID Application: …'")
        for cmd in notarize_commands(dmg, notary_profile):
            _run(cmd)
    print(f"made {dmg} ({dmg.stat().st_size / 1e6:.0f} MB)")
    return dmg


def run_bundle_self_test(dist: Path) -> int:
    exe = executable_path(dist)
    env = dict(os.environ)
    if sys.platform.startswith("linux") and not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
    print(f"+ {exe} --self-test", flush=True)
    return subprocess.run([str(exe), "--self-test"], env=env).returncode


def folder_size(path: Path) -> int:
    """Bytes in a folder, counting each file once and not following symlinks."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            file = Path(dirpath) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def should_build(dmg: bool, rebuild: bool, identity: str | None, app_exists: bool) -> bool:
    """`make dmg` reuses the app `make app` just built, unless told to rebuild or to sign with an identity."""
    return not dmg or rebuild or bool(identity and identity != "-") or not app_exists


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="packaging/build.py", description="Build the Qwen Desk bundle into dist/.")
    parser.add_argument("--dmg", action="store_true", help="macOS: make a compressed DMG (builds the app if missing)")
    parser.add_argument("--rebuild", action="store_true", help="with --dmg: build the app even if it exists")
    parser.add_argument("--self-test", action="store_true", help="run the built bundle's --self-test afterwards")
    parser.add_argument("--sign", metavar="IDENTITY", help="codesign identity (default: ad-hoc '-')")
    parser.add_argument("--entitlements", type=Path, default=ENTITLEMENTS_PATH, help="entitlements for --sign")
    parser.add_argument("--notarize", metavar="PROFILE", help="notarytool keychain profile (with --dmg and --sign)")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder (default: dist/)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller", help="PyInstaller work folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist, work = args.dist.resolve(), args.work.resolve()
    try:
        version = project_version()
        if args.dmg and sys.platform != "darwin":
            build_dmg(dist, version)  # raises the clear message
        if should_build(args.dmg, args.rebuild, args.sign, executable_path(dist).exists()):
            build_app(dist, work, args.sign, args.entitlements)
        if args.self_test:
            status = run_bundle_self_test(dist)
            if status:
                print(f"build.py: the bundle's self-test failed (exit {status})", file=sys.stderr)
                return status
        if args.dmg:
            build_dmg(dist, version, args.sign, args.notarize)
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"build.py: command failed with exit {exc.returncode}: {' '.join(map(str, exc.cmd))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
