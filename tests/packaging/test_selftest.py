"""The self-test, run in-process from the source tree (the bundle runs the same code in test_bundle.py)."""

from __future__ import annotations

import io

from macapp.devtools import selftest


def test_self_test_passes_from_source_and_reports_each_check(qapp):
    out = io.StringIO()
    status = selftest.run_self_test(out=out)
    report = out.getvalue()
    assert status == 0, report
    assert report.splitlines()[0].startswith("Qwen Desk ")
    for check in ("imports", "qt", "data folders", "fit check", "tiny model", "chat"):
        assert f"ok   {check}" in report, report
    assert "PASS: 6/6 checks" in report
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
