"""`qwen-desk history ...`: the commands, their exit codes and their JSON shapes (a contract for scripts)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from macapp.cli import main
from macapp.core import paths
from macapp.core.history import SCHEMA_VERSION, Store


@pytest.fixture
def saved():
    """Two conversations in the app's own history (under the test's QWEN_DESK_HOME)."""
    with Store.open() as s:
        bread = s.create_conversation("Qwen3.5-0.8B", "Be brief.", {"temperature": 0.6})
        s.add_message(bread.id, "user", "How do I bake sourdough bread?")
        w = s.begin_reply(bread.id, thinking=True, model="Qwen3.5-0.8B")
        w.append("Mix, proof overnight, bake hot.", "They want a recipe.")
        w.finish({"generation_tokens": 8, "generation_tps": 40.0}, "stop")
        tea = s.create_conversation("Qwen3.5-2B")
        s.add_message(tea.id, "user", "Green or black tea?")
        s.add_message(tea.id, "assistant", "Green, for the morning.")
        return bread.id, tea.id


def _run(capsys, *argv):
    code = main(["history", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_json_shape(saved, capsys):
    bread, tea = saved
    code, out, _ = _run(capsys, "list", "--json")
    assert code == 0
    items = json.loads(out)
    assert isinstance(items, list) and [i["id"] for i in items] == [tea, bread]  # newest first
    for item in items:
        assert {"id", "title", "updated"} <= set(item)
        assert isinstance(item["id"], int) and isinstance(item["title"], str) and isinstance(item["updated"], str)
    assert items[1]["title"] == "How do I bake sourdough bread?" and items[1]["messages"] == 2
    assert items[1]["updated"].endswith("Z")


def test_list_plain_and_empty(capsys):
    code, out, _ = _run(capsys)  # bare `history` lists
    assert code == 0 and "No saved conversations yet" in out
    assert json.loads(_run(capsys, "list", "--json")[1]) == []


def test_list_plain_shows_titles(saved, capsys):
    code, out, _ = _run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["ID", "UPDATED"]
    assert "Green or black tea?" in lines[1] and "How do I bake sourdough bread?" in lines[2]


def test_show_with_and_without_reasoning(saved, capsys):
    bread, _ = saved
    code, out, _ = _run(capsys, "show", str(bread))
    assert code == 0 and out.startswith("# How do I bake sourdough bread?")
    assert "Mix, proof overnight" in out and "They want a recipe." in out
    assert "They want a recipe." not in _run(capsys, "show", str(bread), "--no-reasoning")[1]


@pytest.mark.parametrize("reasoning", [True, False])
def test_export_json_shape_and_import_back(saved, capsys, tmp_path, reasoning):
    bread, _ = saved
    extra = [] if reasoning else ["--no-reasoning"]
    code, out, _ = _run(capsys, "export", str(bread), "--format", "json", *extra)
    assert code == 0
    doc = json.loads(out)
    assert doc["id"] == bread and doc["title"] == "How do I bake sourdough bread?"
    assert [{k: m[k] for k in ("role", "content", "reasoning")} for m in doc["messages"]] == [
        {"role": "user", "content": "How do I bake sourdough bread?", "reasoning": "" if reasoning else None},
        {"role": "assistant", "content": "Mix, proof overnight, bake hot.", "reasoning": "They want a recipe." if reasoning else None},
    ]
    target = tmp_path / "bread.json"
    code, out, err = _run(capsys, "export", str(bread), "--format", "json", "--output", str(target), *extra)
    assert code == 0 and out == "" and str(target) in err
    assert json.loads(target.read_text(encoding="utf-8")) == doc
    code, out, _ = _run(capsys, "import", str(target))
    assert code == 0 and out.startswith("Imported as conversation ")
    new_id = int(out.split()[3].rstrip(":"))
    again = json.loads(_run(capsys, "export", str(new_id), "--format", "json", *extra)[1])
    assert again["messages"] == doc["messages"] and again["title"] == doc["title"]


def test_export_markdown_to_file(saved, capsys, tmp_path):
    bread, _ = saved
    target = tmp_path / "bread.md"
    assert _run(capsys, "export", str(bread), "--format", "md", "--no-reasoning", "-o", str(target))[0] == 0
    text = target.read_text(encoding="utf-8")
    assert text.startswith("# How do I bake sourdough bread?") and "They want a recipe." not in text
    with Store.open() as s:
        assert _run(capsys, "export", str(bread))[1] == s.export_markdown(bread)  # md is the default


def test_search_rename_delete(saved, capsys):
    bread, tea = saved
    code, out, _ = _run(capsys, "search", "--json", "proof", "overnight")
    hits = json.loads(out)
    assert code == 0 and [(h["conversation_id"], h["role"]) for h in hits] == [(bread, "assistant")]
    assert "overnight" in hits[0]["snippet"]
    code, out, _ = _run(capsys, "search", "tea")
    assert code == 0 and "Green or black tea?" in out
    assert "No messages contain" in _run(capsys, "search", "zebra")[1]

    assert _run(capsys, "rename", str(tea), "Tea", "choices")[0] == 0
    assert json.loads(_run(capsys, "list", "--json")[1])[0]["title"] == "Tea choices"
    code, out, _ = _run(capsys, "delete", str(tea))
    assert code == 0 and "Deleted conversation" in out and "Tea choices" in out
    assert [i["id"] for i in json.loads(_run(capsys, "list", "--json")[1])] == [bread]


@pytest.mark.parametrize(
    "argv",
    [["show", "999"], ["export", "999", "--format", "json"], ["rename", "999", "x"], ["delete", "999"]],
)
def test_unknown_id_is_a_clear_usage_error(saved, capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert "no conversation 999" in err and "history list" in err


def test_bad_arguments_exit_2(saved, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["history", "show", "abc"])
    assert exc.value.code == 2 and "not a conversation id" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a conversation"}', encoding="utf-8")
    code, _, err = _run(capsys, "import", str(bad))
    assert code == 2 and "not an exported conversation" in err
    code, _, err = _run(capsys, "import", str(tmp_path / "missing.json"))
    assert code == 2 and "Could not read" in err
    assert len(json.loads(_run(capsys, "list", "--json")[1])) == 2  # nothing was added


def test_newer_database_reads_with_a_note_and_refuses_writes(saved, capsys):
    bread, _ = saved
    conn = sqlite3.connect(paths.db_path())
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    code, out, err = _run(capsys, "list", "--json")
    assert code == 0 and len(json.loads(out)) == 2 and "newer version" in err
    code, _, err = _run(capsys, "rename", str(bread), "x")
    assert code == 1 and "nothing changed" in err and "read-only" in err


def test_corrupt_database_is_set_aside_with_a_note(capsys):
    paths.db_path().write_bytes(b"garbage" * 1000)
    code, out, err = _run(capsys, "list", "--json")
    assert code == 0 and json.loads(out) == []
    assert "moved to" in err and ".corrupt-" in err
    assert [p for p in Path(paths.app_home()).iterdir() if ".corrupt-" in p.name][0].read_bytes() == b"garbage" * 1000


def test_the_installed_command(saved):
    """The real entry point, in a fresh process."""
    exe = Path(sys.executable).with_name("qwen-desk")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "macapp"]
    result = subprocess.run([*command, "history", "list", "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [i["id"] for i in json.loads(result.stdout)] == list(reversed(saved))
    result = subprocess.run([*command, "history", "show", "4242"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no conversation 4242" in result.stderr
