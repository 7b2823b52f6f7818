"""Disjoint sets (union-find) over 0..n-1: grouping contracts ops with it, the simulator PS classes."""

from __future__ import annotations

import numpy as np


class DisjointSets:
    def __init__(self, n: int):
        self.parent = np.arange(n)

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return int(i)

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)

    def roots(self) -> np.ndarray:
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)
