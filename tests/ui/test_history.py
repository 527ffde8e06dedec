"""The chat history in the window: opened after the first paint, its notices shown, delete with Undo, search."""

import pytest

from macapp.core import paths
from macapp.core.history import Store
from tests.ui.helpers import edited


@pytest.fixture
def make_window(qtbot, settings):
    made = []

    def make(start: bool = True):
        from macapp.ui.app import make_application
        from macapp.ui.main_window import MainWindow

        make_application()
        w = MainWindow(settings)
        qtbot.addWidget(w)
        w.show()
        qtbot.waitExposed(w)
        if start:
            w.start_background_work(wait=True)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def seed(*chats: tuple[str, str]) -> list[int]:
    """Conversations of (question, answer) saved the way the window saves them."""
    ids = []
    with Store.open() as store:
        for question, answer in chats:
            conv = store.create_conversation(model="tiny")
            store.add_message(conv.id, "user", question)
            store.add_message(conv.id, "assistant", answer)
            ids.append(conv.id)
    return ids


def titles(window) -> list[str]:
    lst = window.sidebar.conversations
    return [lst.item(i).text() for i in range(lst.count())]


def test_the_history_is_opened_after_the_first_paint(make_window):
    seed(("First question", "An answer"))
    w = make_window(start=False)
    assert w.chat.controller.store is None and titles(w) == []  # nothing read yet: the window painted without it
    w.start_background_work(wait=True)
    assert w.chat.controller.store is not None and titles(w) == ["First question"]


def test_a_damaged_history_is_set_aside_and_the_user_is_told(make_window):
    paths.db_path().parent.mkdir(parents=True, exist_ok=True)
    paths.db_path().write_bytes(b"this is not a database" * 200)
    w = make_window()
    assert w.status.notice_label.isVisible()
    assert "damaged" in w.status.notice_label.text() and "moved" in w.status.notice_label.toolTip()
    assert w.chat.controller.store.set_aside is not None and w.chat.controller.store.set_aside.exists()


def test_a_history_that_cannot_be_opened_does_not_stop_the_app(make_window):
    paths.db_path().mkdir(parents=True)  # a folder where the file should be: SQLite cannot open it
    w = make_window()
    assert w.chat.controller.unsaved and w.chat.notice.isVisibleTo(w.chat) and "not saved" in w.chat.notice.text()
    assert w.status.notice_label.isVisible()
    assert w.chat.controller.store.create_conversation(model="tiny").id  # a scratch history still takes chats
    scratch = w.chat.controller.store.path.parent
    assert scratch.name.startswith("qwen-desk-unsaved-") and scratch.is_dir()
    w.close()
    assert not scratch.exists()  # never kept: closing the window removes it, nothing is left in the temp folder


def test_delete_offers_undo_that_puts_the_conversation_back(make_window, qtbot):
    keep, gone = seed(("Keep this one", "ok"), ("Delete this one", "ok"))
    w = make_window()
    with edited(w, qtbot):
        assert w.delete_conversation(gone, confirm=False)
    assert titles(w) == ["Keep this one"]
    assert w.status.undo_button.isVisible() and "Delete this one" in w.status.undo_label.text()
    with edited(w, qtbot):
        w.status.undo_button.click()
    assert sorted(titles(w)) == ["Delete this one", "Keep this one"]
    restored = w.chat.controller.store.get_conversation(gone)
    assert [m.content for m in restored.messages] == ["Delete this one", "ok"]
    assert not w.status.undo_button.isVisible()


def test_undo_is_withdrawn_after_a_few_seconds(make_window, qtbot):
    (gone,) = seed(("Short lived", "ok"))
    w = make_window()
    w.undo_seconds = 0.2
    with edited(w, qtbot):
        w.delete_conversation(gone, confirm=False)
    assert w.status.undo_button.isVisible()
    qtbot.waitUntil(lambda: not w.status.undo_button.isVisible(), timeout=60_000)
    assert w.deleted is None and titles(w) == []


def search(window, qtbot, text):
    """Type a search and wait for what it finds (debounced, found off the GUI thread, delivered by signal)."""
    with qtbot.waitSignal(window.conversation_search.found, timeout=60_000):
        window.sidebar.search.setText(text)


def test_search_filters_the_conversations_and_clearing_shows_all(make_window, qtbot):
    seed(("Tell me about otters", "Otters hold hands while they sleep."), ("Plan a trip", "Pack light."))
    w = make_window()
    assert len(titles(w)) == 2
    search(w, qtbot, "sleep")  # found in an answer, not in a title
    assert titles(w) == ["Tell me about otters"]
    search(w, qtbot, "zebra")
    assert titles(w) == [] and "zebra" in w.sidebar.empty_note.text() and w.sidebar.empty_note.isVisibleTo(w)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(titles(w)) == 2, timeout=60_000)  # listed again, off the GUI thread


def test_typing_a_search_runs_it_once_off_the_gui_thread(make_window, qtbot):
    import threading

    seed(("Tell me about otters", "Otters hold hands while they sleep."), ("Plan a trip", "Pack light."))
    w = make_window()
    store = w.chat.controller.store
    threads = []
    real_search = store.search

    def recording_search(query, *args, **kwargs):  # the real search, and the thread it ran on
        threads.append(threading.current_thread())
        return real_search(query, *args, **kwargs)

    store.search = recording_search
    found = []
    w.conversation_search.found.connect(lambda query, rows: found.append(query))
    for n in range(1, len("sleep") + 1):  # typed a key at a time, faster than the debounce
        w.sidebar.search.setText("sleep"[:n])
    assert len(titles(w)) == 2 and w.conversation_search.searches == 0  # nothing searched yet
    qtbot.waitUntil(lambda: found == ["sleep"], timeout=60_000)
    assert titles(w) == ["Tell me about otters"]
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert w.conversation_search.searches == 1


def test_a_search_answered_after_a_newer_one_was_asked_is_dropped(make_window, qtbot):
    seed(("Tell me about otters", "Otters hold hands while they sleep."), ("Plan a trip", "Pack light."))
    w = make_window()
    store = w.chat.controller.store
    found = []
    w.conversation_search.found.connect(lambda query, rows: found.append((query, [title for _id, title in rows])))
    with store.database.lock:  # the history is busy: the first search waits for it on its thread
        w.sidebar.search.setText("sleep")
        qtbot.waitUntil(lambda: w.conversation_search.searches == 1, timeout=60_000)
        w.sidebar.search.setText("light")  # asked while the first is still running
        qtbot.waitUntil(lambda: w.conversation_search.searches == 2, timeout=60_000)
    qtbot.waitUntil(lambda: bool(found), timeout=60_000)
    qtbot.wait(300)  # the first search's answer has come back by now too (after the lock), and was dropped
    assert found == [("light", ["Plan a trip"])] and titles(w) == ["Plan a trip"]


def test_a_history_from_a_newer_app_is_shown_read_only_with_a_notice(make_window, qtbot):
    import sqlite3

    seed(("From the future", "ok"))
    with sqlite3.connect(paths.db_path()) as conn:
        conn.execute("PRAGMA user_version = 99")
    w = make_window()
    assert w.chat.controller.store.read_only
    assert w.status.notice_label.isVisible() and "newer version" in w.status.notice_label.text()
    assert titles(w) == ["From the future"]  # still readable
    search(w, qtbot, "future")
    assert titles(w) == ["From the future"]


def test_delete_rename_and_undo_run_off_the_gui_thread(make_window, qtbot, monkeypatch):
    import threading

    (key,) = seed(("Old name", "ok"))
    w = make_window()
    store = w.chat.controller.store
    threads: dict[str, list[threading.Thread]] = {}
    for name in ("delete", "restore", "rename"):
        real = getattr(store, name)

        def noting(*args, _real=real, _name=name, **kwargs):  # the real call, and the thread it ran on
            threads.setdefault(_name, []).append(threading.current_thread())
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, noting)
    with edited(w, qtbot):
        w.chat.controller.rename_conversation(key, "New name")  # what the window's Rename dialog asks
    assert titles(w) == ["New name"]
    with edited(w, qtbot):
        w.delete_conversation(key, confirm=False)
    assert titles(w) == [] and w.deleted is not None
    with edited(w, qtbot):
        w.undo_delete()
    assert titles(w) == ["New name"] and store.get_conversation(key).messages[0].content == "Old name"
    assert sorted(threads) == ["delete", "rename", "restore"]
    assert all(len(seen) == 1 and seen[0] is not threading.main_thread() for seen in threads.values())


def test_history_worker_after_close_takes_no_more_work(qtbot):
    """A left turn's last events may come while the window closes: asking then is a no-op, not a RuntimeError."""
    from macapp.ui.chat_history import HistoryWorker

    worker = HistoryWorker()
    got = []
    worker.run(lambda: 1, lambda result, error: got.append(result))
    qtbot.waitUntil(lambda: got == [1], timeout=60_000)
    worker.close()
    ran = []
    worker.run(lambda: ran.append("ran"), lambda result, error: got.append(result))
    qtbot.wait(100)
    assert ran == [] and got == [1] and worker.pending == 0


def test_listing_and_opening_run_off_the_gui_thread(make_window, qtbot, monkeypatch):
    import threading

    from tests.ui.helpers import history_settled, open_conversation

    first, second = seed(("First question", "An answer"), ("Second question", "Another answer"))
    w = make_window()
    store = w.chat.controller.store
    store.rename(first, "Renamed meanwhile")  # the next listing shows it
    threads: dict[str, list[threading.Thread]] = {}
    for name in ("list_conversations", "get_conversation"):
        real = getattr(store, name)

        def noting(*args, _real=real, _name=name, **kwargs):  # the real call, and the thread it ran on
            threads.setdefault(_name, []).append(threading.current_thread())
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, noting)
    w.refresh_conversations()
    history_settled(w.chat, qtbot)
    assert sorted(titles(w)) == ["Renamed meanwhile", "Second question"]
    open_conversation(w, qtbot, second)
    widgets = w.chat.messages.widgets()
    assert w.chat.controller.conversation_id == second
    assert [m.role for m in widgets] == ["user", "assistant"] and widgets[0].text == "Second question"
    assert w.sidebar.conversations.currentItem().text() == "Second question"  # the open one is marked in the list
    assert sorted(threads) == ["get_conversation", "list_conversations"]
    assert all(seen and threading.main_thread() not in seen for seen in threads.values()), threads


def test_a_conversation_asked_for_then_left_for_a_new_chat_is_not_opened(make_window, qtbot):
    from tests.ui.helpers import history_settled

    (key,) = seed(("Not wanted after all", "ok"))
    w = make_window()
    store = w.chat.controller.store
    opened = []
    w.chat.controller.conversation_opened.connect(opened.append)
    with store.database.lock:  # the history is busy: the read waits on the worker
        w.open_conversation(key)
        assert w.chat.controller.opening == key and w.chat.controller.conversation_id is None
        w.new_chat()  # asked before the read came back
    history_settled(w.chat, qtbot)
    assert opened == [] and w.chat.controller.conversation_id is None and w.chat.messages.widgets() == []
