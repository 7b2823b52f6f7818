"""The `tag` command. Each subcommand lives in `tag_core/commands/<name>.py` and exposes
`register(subparsers)` (modules named `_*` are helpers); this module finds them, runs one, and maps input errors to exit 2."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import pkgutil
import re
import sys
import tempfile

from . import commands
from .errors import TagInputError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"tag: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tag", description="TAG: topology-aware deployment of TensorFlow training.")
    parser.add_argument("--db", help="DuckDB file (default: $TAG_HOME/tag.duckdb, TAG_HOME defaults to ./.tag)")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


_ABSL_HEADER = re.compile(rb"([IWEF])\d{4} ")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called"


def _tf_log_lines_kept(text: bytes, min_level: int) -> bytes:
    """The lines of `text` that TF_CPP_MIN_LOG_LEVEL lets through (a message's continuation lines follow it)."""
    kept, keep = [], True
    for line in text.splitlines(keepends=True):
        if header := _ABSL_HEADER.match(line):
            keep = "IWEF".index(header[1].decode()) >= min_level
        elif line.startswith(_ABSL_PREAMBLE):
            keep = min_level <= 1  # absl's own warning
        if keep:
            kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def _stderr_filtered(min_level: int):
    """Send fd 2 to a file meanwhile, then pass on what `_tf_log_lines_kept` keeps."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            os.write(2, _tf_log_lines_kept(captured.read(), min_level))


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """TensorFlow's C++ libraries log while they load (the oneDNN INFO line, absl's "before InitializeLog"
    warning), before TF_CPP_MIN_LOG_LEVEL applies; filter stderr by that level while tensorflow is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run, level = spec.loader.exec_module, os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
            min_level = int(level) if level.isdigit() else 0

            def exec_module(module):
                with _stderr_filtered(min_level):
                    run(module)

            spec.loader.exec_module = exec_module
        return spec


def _quiet_tensorflow_logs() -> None:
    """Before TF loads: its C++ INFO/WARNING lines would precede `tag: error:`. A user's explicit level stays."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def main(argv: list[str] | None = None) -> int:
    _quiet_tensorflow_logs()
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


if __name__ == "__main__":
    sys.exit(main())
