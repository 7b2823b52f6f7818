"""The `tag` command: one module per subcommand in this package, each with `register(subparsers)`
(modules named `_*` are helpers). `main` finds them, runs one, and maps input errors to exit 2.

In: command-line arguments. Out: an exit code (0, 1 on failure, 2 on bad input)."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from tag_core.errors import TagInputError

from ._tf_logs import quiet_tensorflow_logs


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"tag: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tag", description="TAG: topology-aware deployment of TensorFlow training.")
    parser.add_argument("--db", help="the store: a DuckDB file or a postgresql:// URL (default: $TAG_STORE, else $TAG_HOME/tag.duckdb; TAG_HOME defaults to ./.tag)")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    quiet_tensorflow_logs()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # so that a closed pipe shows up here, not at interpreter exit
        return code
    except TagInputError as exc:
        print(f"tag: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`tag models | head -1`): stop quietly, as Python's docs on SIGPIPE advise.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("tag: interrupted", file=sys.stderr)
        return 130
