"""Labels that stay readable at any name length, and file names for report pages.

Model names can be long and have no spaces (`mlp[features=16,hidden=8]`, a file path and function), so
wrapping breaks after punctuation too; what does not fit in `max_lines` ends in an ellipsis, and the
page shows the full name as title text.
"""

from __future__ import annotations

import hashlib
import re

_BREAK_AFTER = re.compile(r"(?<=[\s,\[\]=/:._\-(){}])")  # a line may break after these


def short_label(text: str, width: int = 24, max_lines: int = 2) -> str:
    """`text` wrapped to lines of at most `width` characters (at most `max_lines` of them, the last cut
    with an ellipsis when more would be needed)."""
    lines: list[str] = []
    line = ""
    for piece in (p for p in _BREAK_AFTER.split(text) if p):
        while len(piece) > width:  # a piece with no break point of its own is cut hard
            room = width - len(line)
            line, piece = line + piece[:room], piece[room:]
            lines.append(line)
            line = ""
        if len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    if line:
        lines.append(line)
    lines = [x.strip() for x in lines if x.strip()] or [""]
    if len(lines) > max_lines:
        last = lines[max_lines - 1]
        lines = lines[:max_lines - 1] + [last[:width - 1].rstrip() + "…"]
    return "\n".join(lines)


def page_stem(model: str, topology: str) -> str:
    """A file-name-safe, unique stem for the page of one model × topology (names may hold `[`, `/`, `:`)."""
    digest = hashlib.sha1(f"{model}\0{topology}".encode()).hexdigest()[:8]
    readable = re.sub(r"[^A-Za-z0-9]+", "-", f"{model}--{topology}").strip("-")[:48]
    return f"{readable}-{digest}"
