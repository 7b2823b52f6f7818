"""The children of a local run (servers, workers, measuring clients) run in process groups of their own,
so a signal to the `tag` command's group does not reach them: each ends itself when its parent is gone."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(poll_s: float = 0.5) -> None:
    """End this process as soon as the one that started it is gone (a watcher thread polls the parent's pid)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
