"""TensorFlow's C++ start-up logs, filtered so that `tag`'s own one-line errors stand alone.

TF 2.21's libraries log while they load (the oneDNN INFO line, absl's "before InitializeLog"
warning), before TF_CPP_MIN_LOG_LEVEL is read; so stderr is filtered by that level while
`tensorflow` is first imported.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

_ABSL_HEADER = re.compile(rb"([IWEF])\d{4} ")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called"


def kept_log_lines(text: bytes, min_level: int) -> bytes:
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
    """Send fd 2 to a file meanwhile, then pass on what `kept_log_lines` keeps."""
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
            os.write(2, kept_log_lines(captured.read(), min_level))


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


def quiet_tensorflow_logs() -> None:
    """Before TF loads: its C++ INFO/WARNING lines would precede `tag: error:`. A user's explicit level stays."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
