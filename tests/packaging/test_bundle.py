"""Packaging: Info.plist, icon, DMG and signing command lines, and a real build of the Linux bundle."""

from __future__ import annotations

import ast
import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import macapp
from tests.packaging import bundle_cache

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- version and Info.plist


def test_version_comes_from_pyproject_and_matches_the_package(build):
    assert build.project_version() == macapp.__version__


def test_version_is_read_without_tomllib_too(build, monkeypatch, tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[build-system]\nrequires = []\n\n[project]\nname = "x"\nversion = "2.3.4"\n')
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    assert build.project_version(pyproject) == "2.3.4"


def test_info_plist_has_the_version_and_the_keys_macos_needs(build):
    version = build.project_version()
    values = build.render_info_plist(version)

    assert values["CFBundleShortVersionString"] == version
    assert values["CFBundleVersion"] == version
    assert values["CFBundleIdentifier"] == build.BUNDLE_ID == "dev.qwendesk.QwenDesk"
    assert values["CFBundleName"] == "Qwen Desk"
    assert values["CFBundlePackageType"] == "APPL"
    assert values["LSMinimumSystemVersion"] == "14.0"  # MLX's macOS wheels need Sonoma or later
    assert values["NSHighResolutionCapable"] is True
    assert values["NSRequiresAquaSystemAppearance"] is False  # dark mode follows the system
    assert values["LSApplicationCategoryType"].startswith("public.app-category.")
    # PyInstaller writes these two for the files it produces; the template must not fight it.
    assert "CFBundleExecutable" not in values and "CFBundleIconFile" not in values
    assert "@VERSION@" not in plistlib.dumps(values).decode()


def test_info_plist_with_an_unknown_placeholder_is_refused(build, tmp_path):
    template = tmp_path / "Info.plist"
    template.write_bytes(plistlib.dumps({"CFBundleShortVersionString": "@VERSION@", "CFBundleVersion": "@BUILD@"}))
    with pytest.raises(build.BuildError, match="CFBundleVersion"):
        build.render_info_plist("1.0", template)


def test_entitlements_grant_only_what_python_and_mlx_need(build):
    with build.ENTITLEMENTS_PATH.open("rb") as fh:
        entitlements = plistlib.load(fh)
    assert entitlements == {
        "com.apple.security.cs.allow-unsigned-executable-memory": True,
        "com.apple.security.cs.disable-library-validation": True,
    }


# ---------------------------------------------------------------- icon


def test_icon_png_is_a_1024_square_with_transparent_corners():
    with Image.open(ROOT / "resources" / "icon.png") as icon:
        assert icon.size == (1024, 1024)
        assert icon.mode == "RGBA"
        assert icon.getpixel((0, 0))[3] == 0  # outside the rounded square
        assert icon.getpixel((512, 200))[3] == 255  # on the tile


def test_icns_holds_every_size_from_16_to_1024():
    with Image.open(ROOT / "resources" / "icon.icns") as icns:
        assert icns.format == "ICNS"
        sizes = {(w, scale) for w, _h, scale in icns.info["sizes"]}
        assert {w for w, _scale in sizes} >= {16, 32, 128, 256, 512}
        assert (512, 2) in sizes and (16, 2) in sizes  # 1024 px and the small Retina sizes
        assert icns.size == (1024, 1024)  # the largest image opens by default
        icns.load()
        assert icns.getpixel((0, 0))[3] == 0 and icns.getpixel((512, 200))[3] == 255


@pytest.mark.slow
def test_committed_icon_is_what_make_icon_draws(tmp_path):
    import importlib.util

    from PIL import ImageChops, ImageStat

    spec = importlib.util.spec_from_file_location("qwen_desk_make_icon", ROOT / "packaging" / "make_icon.py")
    make_icon = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_icon)
    png, icns = make_icon.write_icons(tmp_path / "icon.png", tmp_path / "icon.icns")

    with Image.open(png) as fresh, Image.open(ROOT / "resources" / "icon.png") as committed:
        diff = ImageStat.Stat(ImageChops.difference(fresh.convert("RGBA"), committed.convert("RGBA")))
        assert max(diff.mean) < 1.0  # same drawing; tiny resampling differences between Pillow versions allowed
    assert icns.stat().st_size > 50_000


# ---------------------------------------------------------------- what the spec collects


def test_only_the_qt_modules_the_app_uses_are_kept(build):
    excluded = build.unused_qt_modules()
    for used in ("PySide6.QtCore", "PySide6.QtGui", "PySide6.QtWidgets"):
        assert used not in excluded
    assert "PySide6.QtNetwork" in excluded and "PySide6.QtQml" in excluded


def test_transformers_keeps_the_qwen_tokenizers_and_drops_other_models(build):
    import importlib.util

    hidden = build.transformers_hidden_imports()
    assert "transformers.models.qwen3_5.tokenization_qwen3_5" in hidden
    assert "transformers.models.qwen2.tokenization_qwen2" in hidden
    assert all(importlib.util.find_spec(name) is not None for name in hidden)

    excluded = build.transformers_model_excludes()
    assert "transformers.models.bert" in excluded and "transformers.models.llama" in excluded
    assert not {"transformers.models.auto", "transformers.models.qwen3_5", "transformers.models.qwen2"} & set(excluded)


def test_pictures_bundle_pillow_and_only_the_qwen_packages_of_mlx_vlm(build):
    import importlib.util

    assert "PIL" not in build.EXCLUDED_MODULES  # pictures are read with Pillow
    assert {"cv2", "pyarrow", "datasets", "mlx_audio"} <= set(build.EXCLUDED_MODULES)  # video/audio/datasets: ~400 MB
    for name in build.VISION_PACKAGES + build.VISION_MODULES:
        assert importlib.util.find_spec(name) is not None, name


def test_pyinstaller_puts_the_metal_library_where_mlx_and_the_self_test_look():
    """PyInstaller's own .app layout (run on Linux): data beside a binary goes to Resources, linked back.

    MLX opens the mlx.metallib next to libmlx.dylib (Contents/Frameworks/mlx/lib); resources_dir() is
    sys._MEIPASS/resources, and _MEIPASS is Contents/Frameworks in an .app.
    """
    from PyInstaller.building.osx import BUNDLE

    toc = [
        ("qwen-desk", "/src/qwen-desk", "EXECUTABLE"),
        ("mlx/core.cpython-311-darwin.so", "/src/core.so", "EXTENSION"),
        ("mlx/lib/libmlx.dylib", "/src/libmlx.dylib", "BINARY"),
        ("mlx/lib/mlx.metallib", "/src/mlx.metallib", "DATA"),
        ("resources/icon.png", "/src/icon.png", "DATA"),
    ]
    layout = {dest: (src, kind) for dest, src, kind in BUNDLE._process_bundle_toc(BUNDLE.__new__(BUNDLE), toc)}

    assert layout["Contents/Frameworks/mlx/lib/libmlx.dylib"] == ("/src/libmlx.dylib", "BINARY")
    link, kind = layout["Contents/Frameworks/mlx/lib/mlx.metallib"]
    assert kind == "SYMLINK"
    assert os.path.normpath(os.path.join("Contents/Frameworks/mlx/lib", link)) == "Contents/Resources/mlx/lib/mlx.metallib"
    assert layout["Contents/Resources/mlx/lib/mlx.metallib"] == ("/src/mlx.metallib", "DATA")
    assert layout["Contents/Frameworks/resources"][1] == "SYMLINK"


# ---------------------------------------------------------------- output paths and command lines


def test_bundle_paths_per_platform(build, tmp_path):
    assert build.bundle_path(tmp_path, "darwin") == tmp_path / "Qwen Desk.app"
    assert build.executable_path(tmp_path, "darwin") == tmp_path / "Qwen Desk.app/Contents/MacOS/qwen-desk"
    assert build.executable_path(tmp_path, "linux") == tmp_path / "qwen-desk/qwen-desk"
    assert build.dmg_path(tmp_path, "0.1.0") == tmp_path / "Qwen-Desk-0.1.0.dmg"


def test_pyinstaller_command_builds_the_spec_into_the_given_folders(build, tmp_path):
    cmd = build.pyinstaller_command(tmp_path / "dist", tmp_path / "work", python="/py")
    assert cmd[:3] == ["/py", "-m", "PyInstaller"]
    assert "--noconfirm" in cmd
    assert cmd[cmd.index("--distpath") + 1] == str(tmp_path / "dist")
    assert cmd[cmd.index("--workpath") + 1] == str(tmp_path / "work")
    assert cmd[-1] == str(build.SPEC_PATH)


def test_dmg_is_a_compressed_image_of_the_staging_folder(build, tmp_path):
    cmd = build.hdiutil_command(tmp_path / "stage", tmp_path / "Qwen-Desk-0.1.0.dmg")
    assert cmd[:2] == ["hdiutil", "create"]
    assert cmd[cmd.index("-format") + 1] == "UDZO"
    assert cmd[cmd.index("-srcfolder") + 1] == str(tmp_path / "stage")
    assert cmd[cmd.index("-volname") + 1] == "Qwen Desk"
    assert cmd[-1] == str(tmp_path / "Qwen-Desk-0.1.0.dmg")


def test_dmg_staging_has_the_app_with_its_symlinks_and_an_applications_link(build, tmp_path):
    app = tmp_path / "dist" / "Qwen Desk.app"
    (app / "Contents" / "Resources").mkdir(parents=True)
    (app / "Contents" / "Resources" / "icon.icns").write_bytes(b"icns")
    (app / "Contents" / "Frameworks").mkdir()
    (app / "Contents" / "Frameworks" / "icon.icns").symlink_to("../Resources/icon.icns")

    staging = build.stage_dmg_folder(app, tmp_path / "stage")

    copied = staging / "Qwen Desk.app" / "Contents" / "Frameworks" / "icon.icns"
    assert copied.is_symlink() and copied.read_bytes() == b"icns"  # a signed bundle's symlinks must survive
    assert (staging / "Applications").is_symlink()
    assert os.readlink(staging / "Applications") == "/Applications"


def test_signing_choice_reaches_the_spec_through_the_environment(build):
    adhoc = build.pyinstaller_env(None, None, base={"PATH": "/bin", build.ENV_CODESIGN_IDENTITY: "stale"})
    assert build.ENV_CODESIGN_IDENTITY not in adhoc and adhoc["PATH"] == "/bin"
    assert build.ENV_CODESIGN_IDENTITY not in build.pyinstaller_env("-", None, base={})

    identity = "Developer ID Application: Example (TEAMID1234)"
    signed = build.pyinstaller_env(identity, None, base={})
    assert signed[build.ENV_CODESIGN_IDENTITY] == identity
    assert signed[build.ENV_ENTITLEMENTS] == str(build.ENTITLEMENTS_PATH)


def test_notarization_submits_waits_and_staples(build, tmp_path):
    dmg = tmp_path / "Qwen-Desk-0.1.0.dmg"
    submit, staple, assess = build.notarize_commands(dmg, "qwen-notary")
    assert submit[:3] == ["xcrun", "notarytool", "submit"] and "--wait" in submit
    assert submit[submit.index("--keychain-profile") + 1] == "qwen-notary"
    assert staple == ["xcrun", "stapler", "staple", str(dmg)]
    assert assess[0] == "spctl"
    assert build.codesign_verify_command(tmp_path / "Qwen Desk.app")[:2] == ["codesign", "--verify"]


def test_dmg_reuses_the_built_app_unless_it_must_be_rebuilt(build):
    assert build.should_build(dmg=False, rebuild=False, identity=None, app_exists=True)  # `make app` always builds
    assert not build.should_build(dmg=True, rebuild=False, identity=None, app_exists=True)
    assert build.should_build(dmg=True, rebuild=False, identity=None, app_exists=False)
    assert build.should_build(dmg=True, rebuild=True, identity=None, app_exists=True)
    assert build.should_build(dmg=True, rebuild=False, identity="Developer ID Application: X (T)", app_exists=True)
    assert not build.should_build(dmg=True, rebuild=False, identity="-", app_exists=True)


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only: on a Mac --dmg builds the DMG")
def test_dmg_off_macos_says_why_and_builds_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build.py"), "--dmg", "--dist", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "needs macOS" in result.stderr and "make app" in result.stderr
    assert not (tmp_path / "dist").exists()


# ---------------------------------------------------------------- the real bundle

# On a Mac the bundle is the .app: the Mac CI job builds it with `make dmg` and runs its --self-test.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only: the one-folder bundle")


def test_the_bundles_inputs_change_with_any_source_file_and_not_with_compiled_caches(tmp_path):
    for name in bundle_cache.SOURCES[:3]:
        (tmp_path / name / "__pycache__").mkdir(parents=True)
        (tmp_path / name / "a.py").write_text("x = 1\n")
    for name in bundle_cache.SOURCES[3:]:
        (tmp_path / name).write_text("[project]\n")
    first = bundle_cache.inputs(tmp_path)
    (tmp_path / "macapp" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert bundle_cache.inputs(tmp_path) == first
    (tmp_path / "resources" / "a.py").write_text("x = 2\n")
    assert bundle_cache.inputs(tmp_path) != first


@pytest.fixture(scope="module")
def linux_bundle():
    """The one-folder bundle built with the real spec from what is here now (tests/packaging/bundle_cache.py: built
    once, kept while nothing it is built from changes; `make test` starts its build beside the linters)."""
    try:
        return bundle_cache.ensure()
    except bundle_cache.BuildFailed as exc:
        pytest.fail(f"packaging/build.py failed:\n{exc}")


def _pyz_toc() -> list[tuple]:
    """The modules the bundle's archive holds, as PyInstaller listed them in its work folder (linux_bundle's)."""
    return ast.literal_eval((bundle_cache.WORK / "qwen_desk" / "PYZ-00.toc").read_text())[-1]


@linux_only
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_linux_bundle_passes_its_self_test_and_keeps_data_outside(linux_bundle, tmp_path, build):
    exe = linux_bundle / "qwen-desk"
    internal = linux_bundle / "_internal"
    assert (internal / "resources" / "icon.png").exists()
    assert (internal / "resources" / "Info.plist").exists()
    assert (internal / "mlx" / "lib" / "libmlx.so").exists()
    assert (internal / "PySide6" / "QtWidgets.abi3.so").exists()
    assert not (internal / "PySide6" / "QtNetwork.abi3.so").exists()  # unused Qt modules left out
    assert not (internal / "torch").exists()
    assert (internal / "PIL").exists() and not (internal / "cv2").exists() and not (internal / "pyarrow").exists()
    bundled = {entry[0] for entry in _pyz_toc()}
    assert "macapp.core.fit.estimate" in bundled
    assert not {name for name in bundled if name.split(".")[0] in ("tests", "hypothesis", "pytest", "_pytest")}  # no test code
    assert not {name for name in bundled if name.startswith(build.DEV_ONLY_MODULES)}  # nor the tools that use it
    before = sorted(p.relative_to(linux_bundle) for p in linux_bundle.rglob("*"))

    home = tmp_path / "home"
    # As on a user's machine: no virtualenv, no PYTHONPATH, a plain PATH, offline, started from elsewhere.
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "QT_QPA_PLATFORM": "offscreen",
        "QWEN_DESK_HOME": str(home),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "MLX_DISABLE_COMPILE": "1",
    }
    result = subprocess.run([str(exe), "--self-test"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "PASS" in report and "FAIL" not in report
    assert "every loaded module from inside the bundle" in report
    for check in ("imports", "qt", "bundle", "data folders", "fit check", "tiny model", "chat", "picture"):
        assert f"ok   {check}" in report, report
    log_file = home / "logs" / "qwen-desk.log"
    assert log_file.exists() and "self-test chat ok" in log_file.read_text()
    # Nothing the app wrote (settings, logs, models) landed inside the bundle.
    assert sorted(p.relative_to(linux_bundle) for p in linux_bundle.rglob("*")) == before


@linux_only
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_linux_bundle_answers_the_cli_and_opens_the_window(linux_bundle, tmp_path):
    exe = str(linux_bundle / "qwen-desk")
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert result.stdout.strip() == f"qwen-desk {macapp.__version__}"

    # The real main window, started from the bundle (UI modules, style sheet from resources/, Qt plugins).
    shot = tmp_path / "window.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QWEN_DESK_HOME=str(tmp_path / "home"), LANG="C.UTF-8")
    result = subprocess.run([exe, "--screenshot", str(shot)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    with Image.open(shot) as image:
        assert image.width >= 800 and image.height >= 500
        assert len(set(image.convert("RGB").resize((64, 64)).getdata())) > 8  # drawn, not one flat colour
    # The window path writes the log file a user attaches to a bug report.
    log_text = (tmp_path / "home" / "logs" / "qwen-desk.log").read_text()
    assert "starting: Python" in log_text and "frozen=True" in log_text
