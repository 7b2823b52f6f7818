"""What the planner shows while it works: a line per step, a bar over the search budget."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Callable

from tag_core.search.mcts import Budget, SearchResult


class spinner:
    """A line saying what runs and how long it took, for steps that take a while (when progress is shown).
    A quick step prints nothing, so that small plans and one-line errors stay quiet."""

    def __init__(self, what: str, show: bool, after_s: float = 1.0):
        self.what, self.show, self.after_s = what, show, after_s
        self.timer: threading.Timer | None = None
        self.announced = False

    def _announce(self) -> None:
        print(f"{self.what} ...", end="", file=sys.stderr, flush=True)
        self.announced = True

    def __enter__(self) -> None:
        self.start = time.perf_counter()
        if self.show:
            self.timer = threading.Timer(self.after_s, self._announce)
            self.timer.daemon = True
            self.timer.start()

    def __exit__(self, exc_type, *exc) -> None:
        if self.timer is None:
            return
        self.timer.cancel()
        self.timer.join()
        if self.announced:
            outcome = "stopped" if exc_type else f"{time.perf_counter() - self.start:.1f} s"
            print(f" {outcome}", file=sys.stderr, flush=True)


class search_progress:
    """A tqdm bar over the budget (iterations, else seconds) showing the best time so far."""

    def __init__(self, desc: str, budget: Budget, show: bool):
        self.desc, self.budget, self.show = desc, budget, show
        self.bar = None

    def __enter__(self) -> Callable[[int, SearchResult], None] | None:
        if not self.show:
            return None
        from tqdm import tqdm

        by_time = self.budget.iterations is None and self.budget.seconds is not None
        total = round(self.budget.seconds, 1) if by_time else self.budget.iterations
        self.bar = tqdm(total=total, desc=self.desc, unit="s" if by_time else "it", leave=False, mininterval=0.5)

        def update(iteration: int, best: SearchResult) -> None:
            done = min(round(best.wall_s, 1), total) if by_time else iteration
            if math.isfinite(best.time_s):
                self.bar.set_postfix(best_ms=f"{best.time_s * 1e3:.2f}", sims=best.simulations, refresh=False)
            self.bar.update(done - self.bar.n)  # update() redraws at most every mininterval

        return update

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
