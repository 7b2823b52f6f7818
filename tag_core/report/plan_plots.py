"""Pictures of one plan for its report page: a Gantt chart of the devices the plan uses (the idle ones
folded into one row), TAG's speedup over every baseline with the ideal bound, and memory per device
against its capacity. PNG bytes, like `plots`."""

from __future__ import annotations

import numpy as np

from tag_core.cluster.topology import Topology
from tag_core.simulate.result import SimResult
from tag_core.simulate.timeline import COMM_COLORS, PHASE_COLORS, draw_device, op_phases
from tag_core.simulate.units import KINDS

from .labels import short_label
from .plots import _png, _pyplot

BASELINE_NAMES = {"dp_nccl": "DP-NCCL", "dp_nccl_p": "DP-NCCL-P", "horovod": "Horovod", "mcmc": "MCMC"}
MAX_GANTT_ROWS = 48  # devices drawn one by one; more used devices than this fold into a row too


def used_devices(result: SimResult) -> np.ndarray:
    """Indices of the devices that compute, communicate or hold memory in the simulated iteration."""
    used = (np.asarray(result.busy_s) > 0) | (np.asarray(result.peak_memory_bytes) > 0)
    if result.timeline is not None:
        used[np.unique(result.timeline.compute_device)] = True
        used[np.unique(result.timeline.comm_device)] = True
    return np.flatnonzero(used)


def device_name(topology: Topology, d: int) -> str:
    dev = topology.devices[d]
    return f"{topology.machines[dev.machine].name}:{dev.local}"


def folded_summary(topology: Topology, devices: np.ndarray) -> str:
    """'N idle devices' with the machines they are on (a few, then a count)."""
    machines = sorted({topology.machines[topology.devices[d].machine].name for d in devices})
    shown = ", ".join(machines[:3]) + (f" +{len(machines) - 3} more" if len(machines) > 3 else "")
    return f"{len(devices)} idle device{'s' * (len(devices) != 1)}\n({short_label(shown, 28, 1)})"


def folded_gantt(result: SimResult, graph, topology: Topology, title: str = "") -> bytes:
    """The simulated iteration, one compute and one communication lane per used device, then one empty row for
    all idle devices (the cloud topology has 32 devices; a small model uses a few)."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    tl = result.timeline
    if tl is None:
        raise ValueError("the result has no timeline; run the simulator with timeline=True")
    used = used_devices(result)
    drawn, extra = used[:MAX_GANTT_ROWS], used[MAX_GANTT_ROWS:]
    idle = np.setdiff1d(np.arange(topology.num_devices), used)
    folded_rows = int(len(idle) > 0) + int(len(extra) > 0)
    rows = len(drawn) + folded_rows
    total_ms = result.iteration_time_s * 1e3
    min_width = max(total_ms, 1e-9) / 2000.0  # about one pixel
    phases = op_phases(graph)
    fig, ax = plt.subplots(figsize=(12, 0.62 * rows + 1.9))
    ticks: list[tuple[float, str]] = []
    for i, d in enumerate(drawn):
        y = 2 * (rows - 1 - i)
        draw_device(ax, tl, d, y, phases, min_width)
        ticks += [(y + 1.45, f"{device_name(topology, d)} ({topology.devices[d].gpu.name}) compute"),
                  (y + 0.55, "comm")]
        if result.device_oom[d]:
            ax.text(total_ms, y + 1.0, " OOM", color="red", va="center", fontsize=8)
    y = 2 * (rows - len(drawn) - 1)
    for label, devices in ((f"{len(extra)} more used devices\n(not drawn)", extra),
                           (folded_summary(topology, idle), idle)):
        if len(devices):
            ax.axhspan(y + 0.15, y + 1.85, color="#f0f0f0", zorder=0)
            ticks.append((y + 1.0, label))
            y -= 2
    ax.set_yticks([p for p, _ in ticks], [t for _, t in ticks], fontsize=7)
    ax.set_ylim(0, 2 * rows)
    ax.set_xlim(0, total_ms * 1.02 if total_ms > 0 else 1)
    ax.set_xlabel("time in the iteration (ms)")
    ax.set_title(title or f"{total_ms:.2f} ms per iteration", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=c, label=n) for n, c in PHASE_COLORS.items()]
    legend += [Patch(color=COMM_COLORS[k], label=k) for k in KINDS if (tl.comm_kind == KINDS.index(k)).any()]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return _png(fig)


def baseline_bars(plan: dict, title: str = "") -> bytes:
    """TAG's speedup over each baseline (a bar each, log scale), with the ideal bound behind it: how fast the
    baseline would be beaten by the ideal (compute only, perfectly split) iteration."""
    plt = _pyplot()
    tag_s = plan["tag"]["iteration_time_s"]
    ideal_s = plan.get("ideal_time_s")
    names = [n for n in BASELINE_NAMES if n in plan["baselines"]]
    fig, ax = plt.subplots(figsize=(6.0, 0.5 * len(names) + 1.4))
    values: list[float] = []
    labelled: set[str] = set()  # each legend entry once
    for i, name in enumerate(names):
        y = len(names) - 1 - i
        baseline = plan["baselines"][name]
        if baseline.get("oom"):
            ax.text(1.0, y, "  out of memory: TAG fits, it does not", va="center", fontsize=8, color="#C44E52")
            continue
        speedup = baseline["iteration_time_s"] / tag_s
        values.append(speedup)
        if ideal_s:
            bound = baseline["iteration_time_s"] / ideal_s
            values.append(bound)
            ax.barh(y, bound, color="#d9d9d9", height=0.7, label=_once(labelled, "ideal bound"))
            ax.annotate(f"≤ {bound:.1f}×", (bound, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7, color="#666")
        ax.barh(y, speedup, color="#4C72B0" if speedup >= 1 else "#C44E52", height=0.42,
                label=_once(labelled, "TAG"))
        ax.annotate(f"{speedup:.2f}×", (speedup, y), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=8, fontweight="bold")
    ax.set_xscale("log")
    low, high = min(values + [1.0]), max(values + [1.0])
    ax.set_xlim(min(0.8, low / 1.3), high * 6)  # room for the bound's label
    ax.axvline(1.0, color="#444", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(names)), [BASELINE_NAMES[n] for n in reversed(names)], fontsize=9)
    ax.set_xlabel("TAG's speedup over the baseline (log scale)")
    ax.set_title(title or "TAG against every baseline", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def memory_chart(result: SimResult, topology: Topology, title: str = "") -> bytes:
    """Peak memory of each used device against its capacity (a grey bar), in GB; idle devices folded."""
    plt = _pyplot()
    used = used_devices(result)[:MAX_GANTT_ROWS]
    idle = np.setdiff1d(np.arange(topology.num_devices), used_devices(result))
    labels = [f"{device_name(topology, d)} ({topology.devices[d].gpu.name})" for d in used]
    peak = np.asarray(result.peak_memory_bytes, dtype=float)[used] / 1e9
    capacity = np.asarray(result.memory_capacity_bytes, dtype=float)[used] / 1e9
    if len(idle):
        labels.append(folded_summary(topology, idle))
        peak = np.append(peak, 0.0)
        capacity = np.append(capacity, np.asarray(result.memory_capacity_bytes, dtype=float)[idle].max() / 1e9)
    ys = np.arange(len(labels))[::-1]
    fig, ax = plt.subplots(figsize=(6.0, 0.4 * len(labels) + 1.4))
    ax.barh(ys, capacity, color="#e6e6e6", height=0.75, label="capacity")
    over = peak > capacity
    ax.barh(ys, peak, color=np.where(over, "#C44E52", "#55A868"), height=0.45, label="peak in the iteration")
    for y, p, c in zip(ys, peak, capacity):
        ax.annotate(f"{_size(p * 1e9)} of {_size(c * 1e9)} ({_share(p, c)})" if c else _size(p * 1e9), (max(p, c), y),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
                    color="#C44E52" if p > c else "#333")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlim(0, max(capacity.max(initial=0), peak.max(initial=0)) * 1.6 or 1)
    ax.set_xlabel("GB")
    ax.set_title(title or "memory per device against its capacity", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def _once(seen: set[str], label: str) -> str | None:
    if label in seen:
        return None
    seen.add(label)
    return label


def _share(part: float, whole: float) -> str:
    share = part / whole
    return "under 0.1%" if 0 < share < 0.001 else f"{share:.1%}"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
