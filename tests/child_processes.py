"""Finding the processes a test started, children or forks of a TF zygote (tag_core.tf_children) alike."""

from __future__ import annotations

import os
from pathlib import Path


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descended_from(pid: int, ancestor: int) -> bool:
    try:
        while pid > 1:
            pid = _parent(pid)
            if pid == ancestor:
                return True
    except (OSError, IndexError, ValueError):
        pass
    return False


def started_by(fragment: str, ancestor: int | None = None) -> list[tuple[int, list[str]]]:
    """(pid, command-line words) of each live process below `ancestor` (default: this process) whose command
    line holds `fragment`. A fork's command line is one string (setproctitle): words are split on spaces."""
    ancestor = os.getpid() if ancestor is None else ancestor
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
        except OSError:
            continue
        if any(fragment in word for word in words) and descended_from(int(entry.name), ancestor):
            found.append((int(entry.name), words))
    return found
