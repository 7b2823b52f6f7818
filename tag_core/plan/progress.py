"""What the planner shows while it works: a line per step, a bar over the search budget."""

from __future__ import annotations

import math
import time
from typing import Callable

from tag_core.search.mcts import Budget, SearchResult


class spinner:
    """One line saying what runs, then how long it took (when progress is shown)."""

    def __init__(self, what: str, show: bool):
        self.what, self.show = what, show

    def __enter__(self) -> None:
        self.start = time.perf_counter()
        if self.show:
            import sys

            print(f"{self.what} ...", end="", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self.show:
            import sys

            print(f" {time.perf_counter() - self.start:.1f} s", file=sys.stderr, flush=True)


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
        total = self.budget.seconds if by_time else self.budget.iterations
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
