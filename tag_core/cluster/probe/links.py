"""Nominal bandwidths of the connection classes `nvidia-smi topo -m` reports, and of a machine's GPUs as one
figure (the topology format's `intra_gbps`). Nominal: spec-sheet rates, until `tag calibrate` measures them.

NVLink moves 20 GB/s a link each way on Pascal and 25 GB/s from Volta on (V100: 6 links, A100: 12, H100:
18), so `NV#` is # links at that rate; on NVSwitch systems every pair reports all of a GPU's links. A PCIe
x16 slot moves 15.75 GB/s (gen 3), 31.5 (gen 4) or 63 (gen 5). Paths through a CPU's host bridge, between
host bridges and across the sockets' interconnect lose part of that; the fractions below are nominal too.
"""

from __future__ import annotations

import itertools
import re

from .nvidia_smi import nvlinks

NVLINK_GBPS_PER_LINK = {1: 160.0, 2: 200.0, 3: 200.0, 4: 200.0}
PCIE_X16_GBPS = {3: 126.0, 4: 252.0, 5: 504.0}
PATH_SHARE = {"PIX": 1.0, "PXB": 1.0, "PHB": 0.75, "NODE": 0.6, "SYS": 0.4}
# GPU name tokens -> (NVLink generation, PCIe generation); anything else is taken as NVLink 2 and PCIe 3.
_GENERATIONS = [("h100", 4, 5), ("h200", 4, 5), ("h800", 4, 5), ("gh200", 4, 5), ("a100", 3, 4), ("a800", 3, 4),
                ("a30", 3, 4), ("a10", 3, 4), ("a40", 3, 4), ("l4", 3, 4), ("l40", 3, 4), ("l40s", 3, 4),
                ("v100", 2, 3), ("p100", 1, 3), ("t4", 2, 3)]


def generations(gpu_name: str) -> tuple[int, int]:
    """(NVLink generation, PCIe generation) of a GPU, from its nvidia-smi name."""
    tokens = set(re.findall(r"[a-z0-9]+", gpu_name.lower()))
    for token, nvlink, pcie in _GENERATIONS:
        if token in tokens:
            return nvlink, pcie
    return 2, 3


def pair_gbps(link_class: str, gpu_a: str, gpu_b: str) -> float:
    """Nominal Gbit/s one way between two GPUs joined by `link_class` (`NV#` or a PCIe path class)."""
    (nv_a, pcie_a), (nv_b, pcie_b) = generations(gpu_a), generations(gpu_b)
    links = nvlinks(link_class)
    if links:
        return links * NVLINK_GBPS_PER_LINK[min(nv_a, nv_b)]
    return PCIE_X16_GBPS[min(pcie_a, pcie_b)] * PATH_SHARE[link_class]


def ring_gbps(bandwidth: dict[tuple[int, int], float], members: list[int]) -> float:
    """The bottleneck of the best ring through `members`: what a ring all-reduce over them gets, and so the
    machine's one `intra_gbps`. Exact up to 9 GPUs; beyond, the best of a greedy ring from every start."""
    if len(members) < 2:
        return max(bandwidth.values(), default=0.0)

    def link(a: int, b: int) -> float:
        return bandwidth[(a, b)] if (a, b) in bandwidth else bandwidth[(b, a)]

    def bottleneck(order) -> float:
        return min(link(order[i], order[(i + 1) % len(order)]) for i in range(len(order)))

    if len(members) <= 9:
        first, rest = members[0], members[1:]
        return max(bottleneck((first, *perm)) for perm in itertools.permutations(rest))
    best = 0.0
    for start in members:
        order, left = [start], set(members) - {start}
        while left:
            nearest = max(sorted(left), key=lambda other: link(order[-1], other))
            order.append(nearest)
            left.remove(nearest)
        best = max(best, bottleneck(order))
    return best
