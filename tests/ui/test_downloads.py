from pathlib import Path

from macapp.core.download import inspect_repo
from macapp.ui.downloads import format_eta
from tests.ui.helpers import answer_next_box

REPO = "mlx-community/Qwen3.5-0.8B-4bit"  # a catalog row, served by the hub stand-in with a tiny model's files


def _start_then_pause(window, library, hub_server, model_path, qtbot):
    """Start downloading REPO from the library over a stalling connection, pause it, and return the panel."""
    hub_server.add_repo(REPO, model_path)
    hub_server.stall("*.safetensors", after=20_000, seconds=20)
    library.select(REPO)
    panel = library.details.download_panel
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.pause_button.isVisibleTo(window) and "Downloading" in panel.headline.text(), timeout=60_000)
    panel.pause_button.click()
    qtbot.waitUntil(lambda: panel.headline.text().startswith("Paused"), timeout=60_000)
    return panel


def test_download_from_the_library_then_load_is_possible(window, library, hub_server, tiny_moe_4bit_path, qtbot):
    hub_server.add_repo(REPO, tiny_moe_4bit_path)
    row = library.select(REPO)
    panel = library.details.download_panel
    assert row.local_path is None and not library.details.load_button.isEnabled()
    assert panel.download_button.isVisibleTo(window)
    done = []
    library.downloads.finished.connect(done.append)
    panel.download_button.click()
    qtbot.waitUntil(lambda: done == [REPO], timeout=60_000)
    row = library.selected_row()
    assert row.key == REPO and row.local_path is not None
    assert (Path(row.local_path) / "config.json").is_file()
    assert library.model.data(library.model.index(library.model.rows.index(row), 5)) == "Downloaded"
    assert library.details.load_button.isEnabled()
    assert "Downloaded" in panel.headline.text()
    assert hub_server.bytes_served("*.safetensors") > 0


def test_download_error_is_shown_with_the_action_to_take(window, library, hub_server, qtbot):
    # The hub does not know this repo: the user sees why and what to do, and can try again.
    library.select(REPO)
    panel = library.details.download_panel
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.error.isVisibleTo(window), timeout=60_000)
    assert panel.headline.text() == "Download failed"
    assert REPO in panel.error.text()
    assert "Check the model name" in panel.error.text()
    assert panel.resume_button.isVisibleTo(window) and panel.resume_button.text() == "Try Again"


def test_pause_keeps_data_and_resume_finishes(window, library, hub_server, tiny_moe_4bit_path, qtbot):
    panel = _start_then_pause(window, library, hub_server, tiny_moe_4bit_path, qtbot)
    assert panel.resume_button.isVisibleTo(window)
    assert library.model.data(library.model.index(library.model.rows.index(library.selected_row()), 5)).startswith("Paused")
    assert inspect_repo(REPO).bytes_on_disk > 0
    hub_server.clear_faults()
    done = []
    library.downloads.finished.connect(done.append)
    panel.resume_button.click()
    qtbot.waitUntil(lambda: done == [REPO], timeout=60_000)
    assert library.selected_row().local_path is not None


def test_eta_reads_like_a_person_would_say_it():
    assert format_eta(None) == ""
    assert format_eta(12) == "about 12 s left"
    assert format_eta(150) == "about 2 min left"
    assert format_eta(7300) == "about 2 h 01 min left"


def test_cancel_asks_then_deletes_the_partial_download(window, library, hub_server, tiny_moe_4bit_path, qtbot):
    hub_server.add_repo(REPO, tiny_moe_4bit_path)
    hub_server.stall("*.safetensors", after=20_000, seconds=20)
    library.select(REPO)
    panel = library.details.download_panel
    panel.download_button.click()
    qtbot.waitUntil(lambda: "Downloading" in panel.headline.text() and panel.progress.value() > 0, timeout=60_000)
    assert library.model.data(library.model.index(library.model.rows.index(library.selected_row()), 5)).startswith("↓")
    seen = answer_next_box("Delete")
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: "text" in seen and REPO not in library.downloads.jobs, timeout=60_000)
    assert "Keep it to resume later, or delete it?" in seen["text"]
    assert inspect_repo(REPO) is None or inspect_repo(REPO).bytes_on_disk == 0
    assert panel.download_button.isVisibleTo(window)
    assert library.model.data(library.model.index(library.model.rows.index(library.selected_row()), 5)) == ""


def test_download_with_the_network_down_fails_at_once_with_a_readable_reason(window, library, monkeypatch, qtbot):
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    library.select(REPO)
    panel = library.details.download_panel
    t0 = time.monotonic()
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.error.isVisibleTo(window), timeout=60_000)
    assert time.monotonic() - t0 < 20  # not half a minute of retries (a refused connection is immediate)
    assert "Cannot reach the hub" in panel.error.text() and "Connect to the internet" in panel.error.text()
    assert panel.resume_button.isVisibleTo(window)


def test_delete_of_a_kept_part_respects_another_download_in_progress(window, library, hub_server, tiny_moe_4bit_path, qtbot):
    from PySide6.QtCore import QTimer

    from macapp.core.download import hfcache

    panel = _start_then_pause(window, library, hub_server, tiny_moe_4bit_path, qtbot)
    kept = inspect_repo(REPO).bytes_on_disk
    assert kept > 0
    with hfcache.try_lock(hfcache.repo_lock_path(REPO)) as taken:  # as if another qwen-desk were downloading it
        assert taken
        seen = answer_next_box("Delete")
        later: dict = {}
        QTimer.singleShot(300, lambda: later.setdefault("warning", answer_next_box("OK")))
        panel.cancel_button.click()
        qtbot.waitUntil(lambda: "text" in later.get("warning", {}), timeout=60_000)
    assert "already on this Mac" in seen["text"]
    assert "being downloaded right now" in later["warning"]["text"]
    assert inspect_repo(REPO).bytes_on_disk == kept  # nothing was deleted under the other download
    hub_server.clear_faults()
