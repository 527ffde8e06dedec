"""The self-test, run in-process from the source tree (the bundle runs the same code in test_bundle.py)."""

from __future__ import annotations

import io
import plistlib

from macapp.cli import selftest


def test_self_test_passes_from_source_and_reports_each_check(qapp):
    out = io.StringIO()
    status = selftest.run_self_test(out=out)
    report = out.getvalue()
    assert status == 0, report
    assert report.splitlines()[0].startswith("Qwen Desk ")
    for check in ("imports", "qt", "bundle", "data folders", "fit check", "tiny model", "chat", "picture"):
        assert f"ok   {check}" in report, report
    assert "PASS: 8/8 checks" in report
    assert "log: " in report


def test_a_missing_module_fails_the_self_test_and_names_the_module(qapp, monkeypatch):
    monkeypatch.setattr(selftest, "RUNTIME_MODULES", selftest.RUNTIME_MODULES + ("mlx_lm.models.no_such_model",))
    out = io.StringIO()
    status = selftest.run_self_test(out=out)
    report = out.getvalue()
    assert status == 1
    assert "FAIL imports" in report and "mlx_lm.models.no_such_model" in report
    assert "FAIL (imports)" in report  # the other checks still ran and passed


def test_checks_keep_going_after_a_failure_and_time_each_step():
    def broken() -> str:
        raise ValueError("boom")

    result = selftest._timed("broken", broken)
    assert not result.ok
    assert result.detail.startswith("ValueError: boom (at test_selftest.py:")
    assert result.seconds >= 0


def test_chat_runs_a_few_tokens_on_a_tiny_model(tmp_path):
    detail, path = selftest.check_tiny_model(tmp_path)
    assert (path / "config.json").exists()
    assert path.is_relative_to(tmp_path)
    report = selftest.check_chat(path)
    tokens = int(report.split(" tokens", 1)[0])
    assert 1 <= tokens <= selftest.CHAT_TOKENS


def test_the_picture_check_sees_image_tokens(tmp_path):
    report = selftest.check_picture(tmp_path)
    assert int(report.split(" image tokens", 1)[0]) == 6  # 96x64 pixels in 32x32-pixel tokens


def _fake_app(tmp_path, version="0.1.0", metallib=True):
    """The layout PyInstaller's BUNDLE writes, with the Metal library cross-linked from Resources."""
    app = tmp_path / "Qwen Desk.app"
    contents = app / "Contents"
    (contents / "MacOS").mkdir(parents=True)
    (contents / "MacOS" / "qwen-desk").write_bytes(b"\xcf\xfa\xed\xfe")
    (contents / "Info.plist").write_bytes(plistlib.dumps({"CFBundleShortVersionString": version, "CFBundleExecutable": "qwen-desk"}))
    (contents / "Frameworks" / "mlx" / "lib").mkdir(parents=True)
    (contents / "Frameworks" / "mlx" / "lib" / "libmlx.dylib").write_bytes(b"lib")
    if metallib:
        (contents / "Resources" / "mlx" / "lib").mkdir(parents=True)
        (contents / "Resources" / "mlx" / "lib" / "mlx.metallib").write_bytes(b"metal")
        (contents / "Frameworks" / "mlx" / "lib" / "mlx.metallib").symlink_to("../../../Resources/mlx/lib/mlx.metallib")
    return app


def test_a_well_formed_mac_bundle_has_no_problems(tmp_path):
    assert selftest.mac_bundle_problems(_fake_app(tmp_path), "0.1.0") == []


def test_a_mac_bundle_without_the_metal_library_or_with_a_stale_plist_is_reported(tmp_path):
    problems = selftest.mac_bundle_problems(_fake_app(tmp_path, version="0.0.9", metallib=False), "0.1.0")
    assert any("mlx.metallib" in p for p in problems)
    assert any("'0.0.9'" in p for p in problems)
