"""Gantt chart of a simulated iteration: per device one compute row and one communication row."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from tag_core.capture.graph import OpGraph
from tag_core.cluster.topology import Topology
from tag_core.errors import TagInputError
from tag_core.files import write_atomically

from .result import SimResult
from .units import KINDS

PHASE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "update": "#55A868"}
COMM_COLORS = {"p2p": "#8172B3", "ps_pull": "#937860", "ps_push": "#DA8BC3", "gather": "#8C8C8C", "allreduce": "#C44E52",
               "allgather": "#64B5CD", "broadcast": "#CCB974"}  # no colour twice in one chart


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


def draw_device(ax, tl, device: int, y: float, phases: np.ndarray, min_width: float) -> None:
    """One device's two rows at height `y` (in ms): compute coloured by phase above, communication by kind below."""
    sel = tl.compute_device == device
    for phase, name in enumerate(PHASE_COLORS):
        mine = phases[tl.compute_op[sel]] == phase
        bars = _merge(tl.compute_start[sel][mine] * 1e3, tl.compute_end[sel][mine] * 1e3, min_width)
        ax.broken_barh(bars, (y + 1.05, 0.8), facecolors=PHASE_COLORS[name], linewidth=0)
    csel = tl.comm_device == device
    for k, kind in enumerate(KINDS):
        mine = tl.comm_kind[csel] == k
        bars = _merge(tl.comm_start[csel][mine] * 1e3, tl.comm_end[csel][mine] * 1e3, min_width)
        ax.broken_barh(bars, (y + 0.15, 0.8), facecolors=COMM_COLORS[kind], linewidth=0)


def timeline_formats() -> list[str]:
    """What savefig can write here, by file extension (pgf needs a LaTeX install)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"})


def check_timeline_path(path: str | Path, where: str = "--timeline") -> Path:
    """The chart's file, refused before any work when its extension names no format we can write."""
    path = Path(path)
    if path.is_dir():
        raise TagInputError(where, f"{str(path)!r} is a directory; give a file name, e.g. {str(path / 'gantt.png')!r}")
    formats = timeline_formats()
    if path.suffix.lower().lstrip(".") not in formats:
        got = f"got {path.suffix!r}" if path.suffix else "it has none"
        raise TagInputError(where, f"needs an image file extension ({', '.join(formats)}); {got}")
    return path


def save_timeline(result: SimResult, graph: OpGraph, topology: Topology, path: str | Path, title: str = "") -> Path:
    """Write a Gantt chart of `result` (which must carry a timeline) to `path`, in the format its extension names."""
    path = check_timeline_path(path)
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
        draw_device(ax, tl, d, y, phases, min_width)
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
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lower().lstrip("."), dpi=110)
    plt.close(fig)
    write_atomically(path, image.getvalue(), where="--timeline")
    return path
