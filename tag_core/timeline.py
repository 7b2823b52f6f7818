"""Gantt chart of a simulated iteration: per device one compute row and one communication row."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .graph import OpGraph
from .simulate import SimResult
from .simulate_expand import KINDS
from .topology import Topology

PHASE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "update": "#55A868"}
COMM_COLORS = {"p2p": "#8172B3", "ps_pull": "#937860", "ps_push": "#DA8BC3", "gather": "#8C8C8C", "allreduce": "#C44E52",
               "allgather": "#55A868", "broadcast": "#CCB974"}


def op_phases(graph: OpGraph) -> np.ndarray:
    """0 forward, 1 backward, 2 optimizer update, per op."""
    return np.array([2 if op.is_apply else 1 if op.is_gradient else 0 for op in graph.ops], dtype=np.int64)


def _merge(starts: np.ndarray, ends: np.ndarray, min_width: float) -> list[tuple[float, float]]:
    """Join intervals that touch or overlap (thousands of back-to-back ops draw as one bar)."""
    if len(starts) == 0:
        return []
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    bars: list[list[float]] = [[float(s[0]), float(e[0])]]
    for a, b in zip(s[1:].tolist(), e[1:].tolist()):
        if a <= bars[-1][1] + min_width:
            bars[-1][1] = max(bars[-1][1], b)
        else:
            bars.append([a, b])
    return [(a, max(b - a, min_width)) for a, b in bars]


def save_timeline(result: SimResult, graph: OpGraph, topology: Topology, path: str | Path, title: str = "") -> Path:
    """Write a PNG Gantt chart of `result` (which must carry a timeline) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = result.timeline
    if tl is None:
        raise ValueError("the result has no timeline; run the simulator with timeline=True")
    D = topology.num_devices
    total_ms = result.iteration_time_s * 1e3
    min_width = total_ms / 2000.0  # about one pixel
    phases = op_phases(graph)
    fig, ax = plt.subplots(figsize=(14, 0.55 * D + 1.8))
    labels = []
    for d, dev in enumerate(topology.devices):
        y = 2 * (D - 1 - d)
        sel = tl.compute_device == d
        ops = tl.compute_op[sel]
        for phase, name in enumerate(PHASE_COLORS):
            mine = phases[ops] == phase
            bars = _merge(tl.compute_start[sel][mine] * 1e3, tl.compute_end[sel][mine] * 1e3, min_width)
            ax.broken_barh(bars, (y + 1.05, 0.8), facecolors=PHASE_COLORS[name], linewidth=0)
        csel = tl.comm_device == d
        for k, kind in enumerate(KINDS):
            mine = tl.comm_kind[csel] == k
            bars = _merge(tl.comm_start[csel][mine] * 1e3, tl.comm_end[csel][mine] * 1e3, min_width)
            ax.broken_barh(bars, (y + 0.15, 0.8), facecolors=COMM_COLORS[kind], linewidth=0)
        name = f"{topology.machines[dev.machine].name}:{dev.local} ({dev.gpu.name})"
        labels.append((y + 1.45, f"{name} compute"))
        labels.append((y + 0.55, "comm"))
        if result.device_oom[d]:
            ax.text(total_ms, y + 1.0, " OOM", color="red", va="center", fontsize=8)
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_ylim(0, 2 * D)
    ax.set_xlim(0, total_ms * 1.02 if total_ms > 0 else 1)
    ax.set_xlabel("time in the iteration (ms)")
    ax.set_title(title or f"{graph.model} on {topology.name}: {total_ms:.1f} ms per iteration")
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=c, label=n) for n, c in PHASE_COLORS.items()]
    legend += [Patch(color=COMM_COLORS[k], label=k) for k in KINDS if (tl.comm_kind == KINDS.index(k)).any()]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.08 - 0.6 / (D + 3)), ncol=len(legend), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
