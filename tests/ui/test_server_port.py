"""The Local Server page says in its own words that a port is taken (not the command line's --port flag)."""

from __future__ import annotations

import socket

from macapp.ui.main_window import SERVER


def test_a_port_in_use_is_told_in_the_windows_words(chat, window, qtbot):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        window.show_page(SERVER)
        panel = window.server_panel
        panel.port.setValue(port)
        with qtbot.waitSignal(window.server.failed, timeout=60_000):
            panel.toggle.click()
    text = panel.message.text()
    assert f"Port {port} is already in use by another program" in text
    assert "choose another port here and press Start again" in text
    assert "--port" not in text
    assert panel.toggle.text() == "Start" and not window.server.running
