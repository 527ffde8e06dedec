"""The example outputs in README.md and docs/*.md, written by the code they document (`make docs`).

A page marks each example with the command that makes it:

    <!-- output: qwen-desk fit Qwen3.5-35B-A3B --chip "M4 Max" --memory 64GB --context 20000 -->
    ```
    (whatever is here is replaced)
    ```
    <!-- /output -->

`python -m macapp.devtools.doc_outputs` runs every such command and writes `$ COMMAND` and its output between the
markers; `--check` writes nothing and lists the blocks that are out of date (tests/test_docs.py runs it). The
commands run through `qwen-desk`'s own entry point in one fresh process on a throwaway app home and Hugging Face
cache, offline, with a fixed terminal width, so the output is the built-in catalog's and a "what if" Mac's, the
same on every machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from macapp.cli import main as qwen_desk  # light: the subcommands load what they need when run

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^<!-- output: (?P<command>.+?) -->\n(?P<body>.*?)^<!-- /output -->", re.DOTALL | re.MULTILINE)
PROGRAM = "qwen-desk"
COLUMNS = "100"  # argparse wraps --help at the terminal's width


class DocOutputError(Exception):
    """A marked command that cannot be run as documented."""


@dataclass(frozen=True)
class StaleBlock:
    page: Path
    command: str


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may carry marked outputs: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def run_commands(wanted: list[str], work: Path) -> dict[str, str]:
    """command → the block it gets: the command line, then what it printed. All run in one fresh process (one
    start-up, not one per command) on `work` as app home and HF cache, offline, at a fixed terminal width."""
    for command in wanted:
        argv = shlex.split(command)
        if not argv or argv[0] != PROGRAM:
            raise DocOutputError(f"a documented output must come from `{PROGRAM} …`, not {command!r}")
    if not wanted:
        return {}
    env = {
        **os.environ,
        "QWEN_DESK_HOME": str(work / "home"),
        "HF_HOME": str(work / "hf"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": COLUMNS,
        "PYTHONPATH": str(ROOT),
    }
    child = [sys.executable, "-m", "macapp.devtools.doc_outputs", "--print-outputs", *wanted]
    done = subprocess.run(child, capture_output=True, text=True, env=env, cwd=work, timeout=300)
    if done.returncode != 0:
        raise DocOutputError(done.stderr.strip()[-1000:])
    printed: dict[str, str] = json.loads(done.stdout)
    return {command: f"```\n$ {command}\n{printed[command].rstrip()}\n```\n" for command in wanted}


def print_outputs(wanted: list[str]) -> int:
    """In the child run_commands starts: each command through the real `qwen-desk` entry point, its output as JSON."""
    printed = {}
    for command in wanted:
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            try:
                status = qwen_desk(shlex.split(command)[1:])
            except SystemExit as exit_:  # --help
                status = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
        if status != 0:
            print(f"`{command}` exited {status}", file=sys.stderr)
            return 1
        printed[command] = captured.getvalue()
    print(json.dumps(printed))
    return 0


def render(text: str, outputs: dict[str, str]) -> str:
    """The page with every marked block holding its command's output."""
    return BLOCK.sub(lambda match: f"<!-- output: {match['command']} -->\n{outputs[match['command']]}<!-- /output -->", text)


def commands(texts: list[str]) -> list[str]:
    """Every marked command once, in page order."""
    return list(dict.fromkeys(match["command"] for text in texts for match in BLOCK.finditer(text)))


def regenerate(files: list[Path], write: bool) -> list[StaleBlock]:
    """Run the marked commands and bring the pages up to date, or only say which blocks are not."""
    texts = {page: page.read_text() for page in files}
    wanted = commands(list(texts.values()))
    with tempfile.TemporaryDirectory(prefix="qwen-desk-docs-") as work:
        outputs = run_commands(wanted, Path(work))
    stale = []
    for page, text in texts.items():
        for match in BLOCK.finditer(text):
            if match["body"] != outputs[match["command"]]:
                stale.append(StaleBlock(page, match["command"]))
        if write and (fresh := render(text, outputs)) != text:
            page.write_text(fresh)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m macapp.devtools.doc_outputs", description="The example outputs in README.md and docs/*.md, written by the code they document."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a documented output is out of date")
    parser.add_argument("files", nargs="*", type=Path, help="pages to update (default: README.md and docs/*.md)")
    parser.add_argument("--print-outputs", nargs="+", metavar="COMMAND", help=argparse.SUPPRESS)  # run_commands' child
    args = parser.parse_args(argv)
    if args.print_outputs:
        return print_outputs(args.print_outputs)
    try:
        stale = regenerate(args.files or pages(), write=not args.check)
    except DocOutputError as exc:
        print(f"doc_outputs: {exc}", file=sys.stderr)
        return 2
    for block in stale:
        print(
            f"{'out of date' if args.check else 'updated'}: {block.page.relative_to(ROOT) if block.page.is_relative_to(ROOT) else block.page}: {block.command}"
        )
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
