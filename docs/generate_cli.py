"""Keep the `--help` blocks of docs/cli.md equal to what `tag` prints.

    .venv/bin/python docs/generate_cli.py          # rewrite the generated blocks in docs/cli.md
    .venv/bin/python docs/generate_cli.py --check  # exit 1 if docs/cli.md is stale (tests/test_docs.py does this)

docs/cli.md is prose written by hand with one generated block per command, between

    <!-- generated: tag plan -->
    ...
    <!-- end generated -->

This script fills each block with the command's help from `tag_core.cli.build_parser()` (the parser
only: no TensorFlow import) at a fixed width of 100 columns, so the output is the same on any terminal.
A command without a block, or a block naming no command, is an error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"
WIDTH = 100
BLOCK = re.compile(r"<!-- generated: (?P<name>[^>]*?) -->\n.*?<!-- end generated -->", re.S)


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands(parser: argparse.ArgumentParser, prefix: str = "tag") -> dict[str, argparse.ArgumentParser]:
    """Every command line `tag ...` names, top level first, nested subcommands after their parent."""
    found = {prefix: parser}
    for name, sub in subparsers_of(parser).items():
        found.update(commands(sub, f"{prefix} {name}"))
    return found


@contextmanager
def fixed_width(columns: int = WIDTH):
    # argparse's HelpFormatter reads the terminal width (COLUMNS first) when it formats help.
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def help_text(parser: argparse.ArgumentParser) -> str:
    with fixed_width():
        return parser.format_help().rstrip() + "\n"


def render(text: str, parser: argparse.ArgumentParser | None = None) -> str:
    """`text` (docs/cli.md) with every generated block filled in from the parser."""
    if parser is None:
        from tag_core.cli import build_parser

        parser = build_parser()
    known = commands(parser)
    named = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = [n for n in named if n not in known]
    missing = [n for n in known if n not in named]
    twice = sorted({n for n in named if named.count(n) > 1})
    problems = [f"a generated block names {n!r}, which is not a command" for n in unknown]
    problems += [f"{n!r} has no generated block: add `<!-- generated: {n} -->` + `<!-- end generated -->`"
                 for n in missing]
    problems += [f"{n!r} has more than one generated block" for n in twice]
    if problems:
        raise ValueError("docs/cli.md: " + "; ".join(problems))

    def fill(match: re.Match) -> str:
        name = match.group("name")
        return f"<!-- generated: {name} -->\n```text\n$ {name} --help\n{help_text(known[name])}```\n<!-- end generated -->"

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale; write nothing")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    current = CLI_MD.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print("docs/cli.md is stale: run `.venv/bin/python docs/generate_cli.py`", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        CLI_MD.write_text(wanted)
        print(f"updated {CLI_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
