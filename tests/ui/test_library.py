import os
import subprocess
import sys
from pathlib import Path


from macapp.core import catalog, hardware
from macapp.core.fit import estimate
from macapp.ui.library_model import FIT_COL
from tests.ui.helpers import answer_next_box

ROOT = Path(__file__).resolve().parents[2]


def _row_for(library, name, bits):
    return next(r for r in library.model.rows if r.ref.name == name and r.ref.bits == bits)


def test_every_catalog_build_has_a_row_with_the_one_sizing_number(library):
    entries = catalog.load_catalog()
    assert len(library.model.rows) == sum(len(e.builds) for e in entries)
    machine = hardware.what_if_machine("M4 Pro", 24 * 1024**3)
    for r in library.model.rows:
        expected = estimate.estimate(r.ref, library.context, machine, kv_bits=library.kv_bits)
        assert r.estimate.total_bytes == expected.total_bytes
        assert r.estimate.verdict == expected.verdict


def test_best_fitting_model_is_suggested_and_selected(library):
    suggestion = library.suggested_row()
    assert suggestion is not None and suggestion.estimate.verdict == "fits"
    assert library.selected_row().key == suggestion.key
    bigger_fitting = [r for r in library.model.rows if r.estimate.verdict == "fits" and r.estimate.weights_bytes > suggestion.estimate.weights_bytes]
    assert bigger_fitting == []
    assert suggestion.title in library.summary.text()


def test_context_and_kv_bits_update_badges_at_once(library, settings):
    library.select("Qwen3.5-9B-4bit")
    at_32k = library.selected_row().estimate.total_bytes
    library.set_context(262_144)
    row = _row_for(library, "Qwen3.5-9B", 4)
    assert row.estimate.context == 262_144 and row.estimate.total_bytes > at_32k
    assert library.model.headerData(FIT_COL, __import__("PySide6.QtCore").QtCore.Qt.Orientation.Horizontal) == "Fit at 256K"
    assert "262,144 tokens" in library.details.total.text()
    full = row.estimate.kv_cache_bytes
    library.kv_combo.setCurrentIndex(library.kv_combo.findData(4))
    row = _row_for(library, "Qwen3.5-9B", 4)
    assert row.estimate.kv_cache_bytes < full / 3
    assert settings.get("library.context") == 262_144 and settings.get("library.kv_bits") == 4
    # The details view shows the same number as the row.
    library.select("Qwen3.5-9B-4bit")
    shown = library.details.legend_values["kv"].text()
    from macapp.core.memory import format_bytes

    assert shown == format_bytes(row.estimate.kv_cache_bytes)


def test_offline_shows_catalog_and_says_downloads_are_unavailable(qtbot, monkeypatch, settings):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from macapp.ui.main_window import MainWindow

    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.start_background_work(wait=True)
    assert len(w.library.model.rows) > 10
    assert "downloads are unavailable" in w.library.summary.text()
    w.library.select("Qwen3.5-0.8B-4bit")
    assert "unavailable offline" in w.library.details.download_panel.headline.text()
    assert not w.library.details.download_panel.download_button.isVisibleTo(w)


def test_guardrail_refuses_a_model_that_does_not_fit_unless_load_anyway(window, library, tiny_dense_path, qtbot):
    library.load_requested.disconnect(window.chat.load_model)  # this test stops at the request
    library.set_machine(hardware.what_if_machine("M1", 512 * 1024**2))  # a Mac far too small for anything
    row = library.open_local_folder(str(tiny_dense_path))
    assert row.estimate.verdict == "too_big"
    requested = []
    library.load_requested.connect(requested.append)

    seen = answer_next_box("Cancel")
    assert library.request_load() is False
    assert requested == []
    assert "GPU budget" in seen["text"] and "needs about" in seen["text"]

    answer_next_box("Load anyway")
    assert library.request_load() is True
    assert requested and Path(requested[0].local_path) == Path(tiny_dense_path)
    # The engine's budget is this machine's real RAM, never the "what if" profile's.
    real = hardware.detect_machine(use_mlx=False).memory_bytes
    assert real != 512 * 1024**2 and library.detected.memory_bytes == real
    assert requested[0].load.anyway and requested[0].load.memory_budget_bytes == real


def test_status_bar_says_when_it_shows_a_what_if_machine(window, library):
    text = window.status.machine_label.text()
    assert text.startswith("What if:") and "M4 Pro" in text and "24 GB" in text  # the fixture's what-if profile, labelled
    window.status.set_machine(library.detected)
    assert not window.status.machine_label.text().startswith("What if")


def test_status_bar_warns_about_a_what_if_mac_that_does_not_exist(window):
    assert "no such Mac" not in window.status.machine_label.text()  # the fixture's 24 GB M4 Pro exists
    window.status.set_machine(hardware.what_if_machine("M4 Pro", 3 * 1024**4))
    label = window.status.machine_label
    assert label.text().endswith("(no such Mac)") and label.objectName() == "Warning"
    assert "at most 64 GB" in label.toolTip()


def test_rows_are_built_without_reading_the_catalog_again(library, monkeypatch):
    from macapp.core import catalog

    def no_reads(*_a, **_k):
        raise AssertionError("the catalog was read again for a context change")

    monkeypatch.setattr(catalog, "load_catalog", no_reads)
    before = len(library.model.rows)
    library.set_context(8192)
    assert len(library.model.rows) == before and library.model.context == 8192


def test_screenshot_flag_paints_the_window_without_importing_mlx(tmp_path):
    out = tmp_path / "main.png"
    code = (
        "import sys; from macapp.ui.app import run_app; rc = run_app(screenshot=sys.argv[1]);"
        "print('MLX', 'mlx.core' in sys.modules, 'mlx_lm' in sys.modules, 'mlx_vlm' in sys.modules, 'PIL' in sys.modules); sys.exit(rc)"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    res = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "MLX False False False False" in res.stdout  # mlx-lm, mlx-vlm and Pillow wait for the first model / picture
    assert out.stat().st_size > 10_000
    from PySide6.QtGui import QImage

    img = QImage(str(out))
    assert img.width() >= 900 and img.height() >= 600


def test_window_size_and_choices_persist_between_runs(qtbot, settings):
    from macapp.ui.main_window import MainWindow

    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.show()
    w.resize(900, 700)  # the offscreen screen is small: restoreGeometry keeps a window inside the screen
    w.library.set_context(65536)
    w.chat.composer.thinking.setChecked(False)
    w.close()
    again = MainWindow(settings)
    qtbot.addWidget(again)
    again.show()
    assert settings.get("window.geometry")
    assert (again.width(), again.height()) == (900, 700)
    assert again.library.context == 65536
    assert not again.chat.composer.thinking.isChecked()


def test_refresh_from_hub_brings_exact_sizes_into_the_badges(window, qtbot, hub_server):
    import json as _json

    library = window.library
    config = {"model_type": "qwen3_5", "text_config": {**library.entries[0].arch.__dict__}, "quantization": {"group_size": 64, "bits": 4}}
    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", {"config.json": _json.dumps(config).encode(), "model.safetensors": b"\0" * 2_345_678})
    before = _row_for(library, "Qwen3.5-0.8B", 4).estimate
    assert not before.weights_exact
    with qtbot.waitSignal(library.hub_refreshed, timeout=60000) as signal:
        window.refresh_catalog_action.trigger()
    errors = signal.args[0]
    assert "mlx-community/Qwen3.5-0.8B-4bit" not in errors and "mlx-community/Qwen3.5-9B-4bit" in errors
    after = _row_for(library, "Qwen3.5-0.8B", 4).estimate
    assert after.weights_exact and after.weights_bytes == 2_345_678
    assert "could not be read" in window.status.currentMessage()


def test_fit_badge_tooltip_gives_the_reading_time_and_the_ways_out(library):
    from PySide6.QtCore import Qt

    library.set_context(8192)
    i = next(i for i, r in enumerate(library.model.rows) if r.ref.name == "Qwen3.5-35B-A3B" and r.ref.bits == 4)
    row = library.model.rows[i]
    assert row.estimate.verdict == "too_big"  # the fixture's 24 GB M4 Pro
    tip = library.model.data(library.model.index(i, FIT_COL), Qt.ItemDataRole.ToolTipRole)
    assert "GPU budget" in tip and "Reading a 8,192-token prompt: ~" in tip
    assert "No context fits" in tip and "sudo sysctl iogpu.wired_limit_mb=" in tip and "resets at reboot" in tip
    assert tip.index("wired_limit_mb") < tip.index("next build down")  # cheapest first
    fitting = next(i for i, r in enumerate(library.model.rows) if r.estimate.verdict == "fits")
    tip = library.model.data(library.model.index(fitting, FIT_COL), Qt.ItemDataRole.ToolTipRole)
    assert "Reading a" in tip and "sysctl" not in tip


def test_details_pane_shows_reading_time_and_advice(library):
    library.set_context(20000)
    library.select("Qwen3.5-9B-4bit")
    details = library.details
    est = library.selected_row().estimate
    assert "Reading a 20,000-token prompt" in details.reading.text() and "tok/s" in details.reading.text()
    assert f"{est.prefill_tps_estimate:,.0f} tok/s" in details.reading.text()
    assert not details.advice.isVisibleTo(details)
    library.select("Qwen3.5-35B-A3B-4bit")
    assert details.advice.isVisibleTo(details)
    text = details.advice.text()
    assert "sudo sysctl iogpu.wired_limit_mb=" in text and "Qwen Desk never changes this setting" in text
    assert "choose a smaller model or 4-bit" not in text
    assert any(line.startswith("reading a 20,000-token prompt") for line in est.derivation)


def test_details_pane_gives_the_same_ways_out_as_fit_json(library, capsys):
    # The fixture's 24 GB M4 Pro at 32K: the raised wired limit with the longest context it allows, word for word
    # (and number for number) what `qwen-desk fit --json` says for the same Mac.
    import html
    import json

    from macapp.cli import main

    library.set_context(32768)
    library.select("Qwen3.5-35B-A3B-4bit")
    assert main(["fit", "Qwen3.5-35B-A3B", "--bits", "4", "--chip", "M4 Pro", "--memory", "24GB", "--context", "32768", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["advice"]["steps"]
    assert steps[0]["remedy"] == "wired_limit" and steps[0]["context"] < 32768
    shown = html.unescape(library.details.advice.text().replace("<code>", "`").replace("</code>", "`"))
    for i, step in enumerate(steps, 1):
        assert f"{i}. {step['text']}" in shown


def test_guardrail_names_the_ways_out_and_keeps_load_anyway(library):
    library.set_context(8192)
    library.select("Qwen3.5-35B-A3B-4bit")
    text = library.guardrail_message(library.selected_row())
    assert "needs about" in text and "Ways to make it fit:\n1. let macOS wire more memory" in text
    assert "sudo sysctl iogpu.wired_limit_mb=" in text and "Loading it anyway" in text
