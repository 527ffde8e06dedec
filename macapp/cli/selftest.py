"""`qwen-desk --self-test`: check an installation (a bundle above all) end to end and exit 0 or 1.

Imports everything, starts Qt, checks the data folders sit outside the bundle, runs the fit check for a
catalog model, generates a tiny model of the real architecture in a temp folder and chats a few tokens
with it through the real engine, then one picture through mlx-vlm's tower on a tiny model with one. A broken
bundle is caught by this command, not by a user.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import macapp
from macapp import __version__
from macapp.core import catalog, hardware, paths
from macapp.core.engine import Engine
from macapp.core.events import Reply
from macapp.core.fit import estimate
from macapp.core.logs import setup_logging
from macapp.core.sampling import SamplingParams
from macapp.core.vision.images import PreparedImage
from macapp.core.demo.tiny_model import make_tiny_model
from macapp.core.demo.tiny_vlm import make_tiny_vlm

log = logging.getLogger(__name__)

CHAT_TOKENS = 8
ENGINE_TIMEOUT_S = 300
FIT_MODEL = "Qwen3.5-9B"
FIT_BITS = 4
FIT_CONTEXT = 8192

# Loaded by name at run time (mlx-lm picks the model class from config.json's model_type): a bundle that
# lacks one of these still starts, then fails on the first model load.
RUNTIME_MODULES = (
    "mlx.core",
    "mlx.nn",
    "mlx_lm",
    "mlx_lm.generate",
    "mlx_lm.sample_utils",
    "mlx_lm.models.cache",
    "mlx_lm.models.qwen3_5",
    "mlx_lm.models.qwen3_5_moe",
    "transformers.models.qwen3_5.tokenization_qwen3_5",
    "transformers.models.qwen2.tokenization_qwen2",
    "huggingface_hub",
    "tokenizers",
    "PySide6.QtCore",
    "PySide6.QtGui",
    "PySide6.QtWidgets",
    # pictures: mlx-vlm loads its model and processor classes by name too
    "PIL.Image",
    "mlx_vlm.utils",
    "mlx_vlm.models.qwen3_5",
    "mlx_vlm.models.qwen3_5_moe",
    "mlx_vlm.models.qwen3_vl.processing_qwen3_vl",
)


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str
    seconds: float


class SelfTestFailure(Exception):
    """A check found a problem; the message says which."""


def bundle_root() -> Path | None:
    """The frozen bundle's folder (the .app on macOS), or None when running from source."""
    if not getattr(sys, "frozen", False):
        return None
    exe = Path(sys.executable).resolve()
    for parent in exe.parents:
        if parent.suffix == ".app":
            return parent
    return exe.parent


# ---------------------------------------------------------------- the checks


def check_imports() -> str:
    names = sorted(_macapp_modules()) + list(RUNTIME_MODULES)
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # report every missing module, not only the first
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    if failed:
        raise SelfTestFailure("cannot import " + "; ".join(failed))
    versions = ", ".join(f"{dist} {_dist_version(dist)}" for dist in ("mlx", "mlx-lm", "transformers", "PySide6"))
    root = bundle_root()
    if root is None:
        return f"{len(names)} modules; {versions}"
    outside = _modules_outside(root)
    if outside:
        raise SelfTestFailure(f"{len(outside)} modules loaded from outside the bundle, e.g. {outside[0]}")
    return f"{len(names)} modules, every loaded module from inside the bundle; {versions}"


def _modules_outside(root: Path) -> list[str]:
    """Loaded modules whose file is not in the bundle: a bundle leaning on a Python installed elsewhere."""
    root = root.resolve()
    outside = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        # Relative names are virtual (shiboken's embedded signature modules), not files on disk.
        if file and os.path.isabs(file) and not Path(file).resolve().is_relative_to(root):
            outside.append(f"{name} ({file})")
    return sorted(outside)


def _macapp_modules() -> set[str]:
    names = set()
    for info in pkgutil.walk_packages(macapp.__path__, prefix="macapp."):
        if info.name.rsplit(".", 1)[-1] != "__main__":  # macapp.__main__ runs the CLI on import
            names.add(info.name)
    if not any(name.startswith("macapp.core.") for name in names):
        raise SelfTestFailure("the macapp package has no modules (a bundle built without collect_submodules?)")
    return names


def _dist_version(dist: str) -> str:
    """The version the module itself reports (bundles may lack package metadata)."""
    from importlib import metadata

    module = sys.modules.get({"mlx": "mlx.core", "mlx-lm": "mlx_lm"}.get(dist, dist))
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def check_qt() -> str:
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no screen: Qt would abort the process
    from PySide6.QtGui import QGuiApplication, QPixmap
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication([sys.argv[0]])
    if not isinstance(app, QGuiApplication):  # a QCoreApplication of someone else's: no widgets can be made
        raise SelfTestFailure("a Qt application without a GUI is already running in this process")
    label = QLabel("Qwen Desk")
    label.adjustSize()
    image = label.grab().toImage()
    label.deleteLater()
    if image.isNull() or image.width() == 0:
        raise SelfTestFailure("Qt could not render a widget")
    icon_path = paths.resources_dir() / "icon.png"
    icon = QPixmap(str(icon_path))
    if icon.isNull():
        raise SelfTestFailure(f"cannot load the app icon from {icon_path}")
    return f"platform {app.platformName()}, rendered a {image.width()}×{image.height()} label, icon {icon.width()} px"


def check_bundle() -> str:
    root = bundle_root()
    if root is None:
        return "running from source, not a bundle"
    missing = [name for name in ("icon.png", "Info.plist") if not (paths.resources_dir() / name).exists()]
    if missing:
        raise SelfTestFailure(f"resources missing from the bundle: {', '.join(missing)}")
    if root.suffix != ".app":
        return f"one-folder bundle at {root}"
    problems = mac_bundle_problems(root, __version__)
    problems += _codesign_problems(root)
    if problems:
        raise SelfTestFailure("; ".join(problems))
    return f"{root.name}: Info.plist {__version__}, mlx.metallib beside libmlx, signature valid"


def mac_bundle_problems(app: Path, version: str) -> list[str]:
    """What is wrong with a macOS .app's layout: Info.plist, executable, MLX's Metal library."""
    import plistlib

    problems = []
    info_path = app / "Contents" / "Info.plist"
    if not info_path.exists():
        return [f"no Contents/Info.plist in {app.name}"]
    with info_path.open("rb") as fh:
        info = plistlib.load(fh)
    if info.get("CFBundleShortVersionString") != version:
        problems.append(f"Info.plist says version {info.get('CFBundleShortVersionString')!r}, the app is {version}")
    executable = app / "Contents" / "MacOS" / str(info.get("CFBundleExecutable", ""))
    if not info.get("CFBundleExecutable") or not executable.is_file():
        problems.append(f"CFBundleExecutable {info.get('CFBundleExecutable')!r} is not in Contents/MacOS")
    # MLX loads the Metal library that sits beside libmlx.dylib (PyInstaller links it into Frameworks).
    libmlx_dir = app / "Contents" / "Frameworks" / "mlx" / "lib"
    if not (libmlx_dir / "mlx.metallib").is_file():  # is_file follows the symlink
        problems.append("mlx.metallib is not beside libmlx in Contents/Frameworks/mlx/lib: every GPU op would fail")
    return problems


def _codesign_problems(app: Path) -> list[str]:
    import shutil
    import subprocess

    codesign = shutil.which("codesign") or "/usr/bin/codesign"
    if not Path(codesign).exists():
        return []
    result = subprocess.run([codesign, "--verify", "--deep", "--strict", str(app)], capture_output=True, text=True)
    if result.returncode != 0:
        return [f"codesign --verify failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}"]
    return []


def check_data_folders() -> str:
    from huggingface_hub import constants

    folders = {"app home": paths.app_home(), "logs": paths.logs_dir(), "HF cache": Path(constants.HF_HUB_CACHE)}
    root = bundle_root()
    if root is not None:
        inside = [name for name, folder in folders.items() if folder.resolve().is_relative_to(root)]
        if inside:
            raise SelfTestFailure(f"{', '.join(inside)} inside the bundle {root}: data must live outside it")
    probe = paths.app_home() / ".self-test-probe"
    probe.write_text("ok", encoding="utf-8")
    probe.unlink()
    return "; ".join(f"{name} {folder}" for name, folder in folders.items())


def check_fit() -> str:
    entries = catalog.load_catalog()
    if not entries:
        raise SelfTestFailure("the model catalog is empty")
    names = [entry.name for entry in entries]
    name = FIT_MODEL if FIT_MODEL in names else names[0]
    model = catalog.resolve_model(name, bits=FIT_BITS)
    machine = hardware.detect_machine()
    est = estimate.estimate(model, context=FIT_CONTEXT, machine=machine)
    if est.verdict not in ("fits", "tight", "too_big") or est.total_bytes <= est.weights_bytes:
        raise SelfTestFailure(f"implausible estimate for {name}: {est.verdict}, {est.total_bytes} bytes")
    return (
        f"{len(entries)} catalog models; {name} {FIT_BITS}-bit at {FIT_CONTEXT} tokens on {machine.chip}: "
        f"{est.verdict} ({est.total_bytes / 1e9:.1f} GB of {est.budget_bytes / 1e9:.1f} GB)"
    )


def check_tiny_model(workdir: Path) -> tuple[str, Path]:
    path = make_tiny_model(workdir / "tiny-moe-4bit", kind="moe", bits=4)
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    return f"moe 4-bit, {size / 1e6:.1f} MB at {path}", Path(path)


def check_chat(model_path: Path) -> str:
    import mlx.core as mx

    if sys.platform == "darwin" and not mx.metal.is_available():
        raise SelfTestFailure("MLX reports no Metal GPU: this Mac cannot run the models on its GPU")
    started = time.monotonic()
    # On a Mac this runs on the GPU, so a bundle without MLX's mlx.metallib fails here.
    via, text, tokens = _chat_with_engine(model_path)
    elapsed = time.monotonic() - started
    if tokens < 1:
        raise SelfTestFailure(f"no tokens generated via {via}")
    device = mx.default_device()
    preview = text.strip().replace("\n", " ")[:24]
    return f"{tokens} tokens via {via} on {device} in {elapsed:.1f} s: {preview!r}"


def _chat_with_engine(model_path: Path) -> tuple[str, str, int]:
    """Load the model on the engine and generate a few tokens."""
    engine = Engine()
    try:
        engine.load(str(model_path)).result(timeout=ENGINE_TIMEOUT_S)
        session = engine.new_session()
        sampling = SamplingParams(max_tokens=CHAT_TOKENS, seed=0)
        reply = session.send("Say hello.", thinking=False, sampling=sampling).result(timeout=ENGINE_TIMEOUT_S)
        assert isinstance(reply, Reply)  # a chat job ends with its Reply (result() raises a Failed)
    finally:
        engine.close()
    return "the engine", reply.reasoning + reply.text, reply.stats.generation_tokens


def check_picture(workdir: Path) -> str:
    """One picture through the engine on a tiny Qwen3.5 with a vision tower: its image tokens must reach the model."""
    from PIL import Image

    path = make_tiny_vlm(workdir / "tiny-vl")
    picture = Image.effect_mandelbrot((96, 64), (-2, -1, 1, 1), 30).convert("RGB")
    engine = Engine()
    try:
        engine.load(str(path)).result(timeout=ENGINE_TIMEOUT_S)
        reply = (
            engine.new_session()
            .send(
                "What is in this picture?",
                thinking=False,
                sampling=SamplingParams(max_tokens=CHAT_TOKENS, seed=0),
                images=[PreparedImage("self-test.png", picture, picture.size)],
            )
            .result(timeout=ENGINE_TIMEOUT_S)
        )
        assert isinstance(reply, Reply)
    finally:
        engine.close()
    if reply.stats.image_tokens < 1:
        raise SelfTestFailure("the picture did not reach the model (0 image tokens)")
    return f"{reply.stats.image_tokens} image tokens, {reply.stats.generation_tokens} tokens generated"


# ---------------------------------------------------------------- running and reporting


def _timed(name: str, fn: Callable[[], str]) -> CheckResult:
    started = time.monotonic()
    try:
        detail, ok = fn(), True
    except Exception as exc:
        log.error("self-test check %r failed", name, exc_info=True)
        detail, ok = f"{type(exc).__name__}: {exc}" if not isinstance(exc, SelfTestFailure) else str(exc), False
        if not isinstance(exc, SelfTestFailure):
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            detail += f" (at {Path(frame.filename).name}:{frame.lineno})"
    return CheckResult(name, ok, detail, time.monotonic() - started)


def run_checks(workdir: Path) -> Iterator[CheckResult]:
    """Every check in order, each a CheckResult; a failed step does not stop the independent ones."""
    yield _timed("imports", check_imports)
    yield _timed("qt", check_qt)
    yield _timed("bundle", check_bundle)
    yield _timed("data folders", check_data_folders)
    yield _timed("fit check", check_fit)
    model_path: list[Path] = []

    def tiny() -> str:
        detail, path = check_tiny_model(workdir)
        model_path.append(path)
        return detail

    yield _timed("tiny model", tiny)
    if model_path:
        yield _timed("chat", lambda: check_chat(model_path[0]))
    else:
        yield CheckResult("chat", False, "skipped: no tiny model to chat with", 0.0)
    yield _timed("picture", lambda: check_picture(workdir))


def run_self_test(out: TextIO | None = None) -> int:
    """Run every check, print a short report, return 0 when all passed and 1 otherwise."""
    out = out or sys.stdout
    log_file = setup_logging()
    where = f"bundle {bundle_root()}" if bundle_root() else f"source {Path(macapp.__file__).parent}"
    print(f"Qwen Desk {__version__} self-test ({where}; Python {platform.python_version()})", file=out)
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="qwen-desk-selftest-") as tmp:
        for result in run_checks(Path(tmp)):
            results.append(result)
            mark = "ok  " if result.ok else "FAIL"
            print(f"  {mark} {result.name:<13} {result.detail} ({result.seconds:.1f} s)", file=out, flush=True)
            log.info("self-test %s %s: %s", result.name, "ok" if result.ok else "FAILED", result.detail)
    failed = [r.name for r in results if not r.ok]
    verdict = "PASS" if not failed else f"FAIL ({', '.join(failed)})"
    print(f"{verdict}: {len(results) - len(failed)}/{len(results)} checks in {time.monotonic() - started:.1f} s", file=out)
    print(f"log: {log_file}", file=out, flush=True)
    return 0 if not failed else 1
