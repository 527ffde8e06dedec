"""The docs cannot go stale unnoticed: the README's length, every relative link and anchor, every screenshot shown,
and the example outputs written by the commands they document (macapp/devtools/doc_outputs.py, `make docs`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from macapp.devtools import doc_outputs

ROOT = Path(__file__).resolve().parents[1]
PAGES = doc_outputs.pages(ROOT)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _links(page: Path) -> list[str]:
    """The link targets of a page's Markdown, code blocks and inline code left out."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_anchor(match) for match in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_the_readme_is_a_five_minute_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into a docs/ page"
    long = [number for number, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"


def test_the_readme_links_every_docs_page():
    linked = {target.split("#")[0] for target in _links(ROOT / "README.md")}
    pages = {f"docs/{page.name}" for page in PAGES if page.parent == ROOT / "docs"}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: — not checked offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_check_catches_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[gone](missing.md) [here](#title) [nowhere](#no-such) `[code](not-a-link.md)`\n")
    assert _links(page) == ["missing.md", "#title", "#no-such"]
    assert _anchors(page) == {"title"}
    assert _anchor("Will it fit? `qwen-desk fit`, `qwen-desk models`") == "will-it-fit-qwen-desk-fit-qwen-desk-models"


def test_every_screenshot_is_shown_on_a_page():
    shown = {(page.parent / target).resolve() for page in PAGES for target in _links(page)}
    unshown = [shot.name for shot in sorted((ROOT / "docs").glob("*.png")) if shot.resolve() not in shown]
    assert not unshown, f"screenshots in docs/ no page shows: {unshown}"


def test_the_documented_outputs_are_what_the_commands_print():
    assert doc_outputs.commands([page.read_text() for page in PAGES]), "no documented output found: the markers moved?"
    stale = doc_outputs.regenerate(PAGES, write=False)
    assert not stale, "out of date (run `make docs`): " + "; ".join(f"{block.page.name}: {block.command}" for block in stale)


def test_a_stale_output_is_found_and_rewritten(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Before.\n\n<!-- output: qwen-desk --version -->\n```\nqwen-desk 0.0.0\n```\n<!-- /output -->\n\n    <!-- output: x -->\n")
    assert doc_outputs.regenerate([page], write=False) == [doc_outputs.StaleBlock(page, "qwen-desk --version")]
    assert "qwen-desk 0.0.0" in page.read_text()  # a check writes nothing

    assert doc_outputs.regenerate([page], write=True)
    text = page.read_text()
    assert "$ qwen-desk --version\nqwen-desk " in text and "qwen-desk 0.0.0" not in text
    assert text.endswith("<!-- /output -->\n\n    <!-- output: x -->\n")  # an indented example is not a block


def test_only_qwen_desk_commands_are_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- output: rm -rf / -->\n```\n```\n<!-- /output -->\n")
    with pytest.raises(doc_outputs.DocOutputError, match="qwen-desk"):
        doc_outputs.regenerate([page], write=False)
