"""Pictures of a plan: the placement heatmap, the simulated Gantt timeline, speedup bars; predicted against
measured step times. PNG bytes."""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path

import numpy as np

from tag_core.cluster.topology import Topology
from tag_core.simulate.strategy import OPTIONS, Strategy

from .labels import short_label

OPTION_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]  # allreduce, ps, duplicate, model_parallel


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def markdown_image(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def placement_heatmap(strategy: Strategy, topology: Topology, title: str = "") -> bytes:
    """Op groups (rows) × devices (columns), coloured by the group's option where it runs there; devices that
    run no group share one column at the right."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    plt = _pyplot()
    machine_of = np.array([d.machine for d in topology.devices])
    grid = np.full((strategy.num_groups, topology.num_devices), np.nan)
    for g in range(strategy.num_groups):
        on = strategy.masks[g][machine_of] & (strategy.batch_shares > 0)
        grid[g, on] = OPTIONS.index(strategy.options[g])
    if strategy.op_devices is not None:  # model-parallel groups: only the devices their ops use
        for g in range(strategy.num_groups):
            if strategy.options[g] == "model_parallel":
                used = np.unique(strategy.op_devices[(strategy.op_groups == g) & (strategy.op_devices >= 0)])
                if len(used):
                    grid[g] = np.nan
                    grid[g, used] = OPTIONS.index("model_parallel")
    # Devices no group runs on fold into one empty column: a small model on 32 devices is a few columns wide.
    used = np.flatnonzero(~np.isnan(grid).all(axis=0))
    idle = topology.num_devices - len(used)
    names = [f"{topology.machines[topology.devices[d].machine].name}:{topology.devices[d].local}" for d in used]
    if idle:
        grid = np.hstack([grid[:, used], np.full((strategy.num_groups, 1), np.nan)])
        names.append(f"{idle} idle device{'s' * (idle != 1)}")
    height = min(12.0, 1.5 + 0.18 * strategy.num_groups)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(names) + 2.5), height))
    ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest",
              cmap=ListedColormap(OPTION_COLORS), vmin=-0.5, vmax=len(OPTIONS) - 0.5)
    if idle:
        ax.axvspan(len(names) - 1.5, len(names) - 0.5, color="#f0f0f0", zorder=0)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=7)
    step = max(1, strategy.num_groups // 30)
    ax.set_yticks(range(0, strategy.num_groups, step))
    ax.set_ylabel("op group (largest compute first)")
    ax.set_title(short_label(title, 60) if title else "placement and option per op group", fontsize=10)
    ax.legend(handles=[Patch(color=c, label=o) for o, c in zip(OPTIONS, OPTION_COLORS)],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return _png(fig)


def gantt(result, graph, topology: Topology, title: str = "") -> bytes:
    """The simulated iteration as a Gantt chart (the result must carry a timeline)."""
    from tag_core.simulate.timeline import save_timeline

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gantt.png"
        save_timeline(result, graph, topology, path, title=title)
        return path.read_bytes()


def speedup_bars(rows: list[dict], title: str = "TAG speedup over DP-NCCL (simulated)") -> bytes:
    """One horizontal bar per (model, topology): TAG's speedup over DP-NCCL. Labels are wrapped and cut
    (`short_label`) so long model names neither overlap nor squeeze the bars; the report's table has them whole."""
    plt = _pyplot()
    labels = [f"{short_label(r['model'], 30)}\n@ {short_label(r['topology'], 26, 1)}" for r in rows]
    values = [r["speedup_vs_dp_nccl"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(8.5, 0.62 * len(rows) + 1.4))
    ys = np.arange(len(rows))[::-1]
    bars = ax.barh(ys, values, color=["#4C72B0" if v >= 1 else "#C44E52" for v in values], height=0.6)
    ax.axvline(1.0, color="#444", linewidth=0.8, linestyle="--")
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:.2f}×" if value else "DP-NCCL out of memory", (bar.get_width(), bar.get_y() + 0.3),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlim(0, max(values + [1.0]) * 1.25)
    ax.set_xlabel("speedup over DP-NCCL")
    ax.set_title(title, fontsize=10)
    return _png(fig)


def training_curve(metrics: dict) -> bytes:
    """The GNN's training curve (`gnn.train` metrics): loss and top-1 agreement per generation, and the speedups the searches found."""
    curve = metrics.get("curve", [])
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"wspace": 0.45})
    gens = np.array([p["generation"] for p in curve])
    series = lambda key: np.array([np.nan if p.get(key) is None else p[key] for p in curve], dtype=float)  # noqa: E731
    left.plot(gens, series("loss"), color="#4C72B0", label="cross-entropy loss")
    left.set_xlabel("generation")
    left.set_ylabel("loss", color="#4C72B0")
    twin = left.twinx()
    twin.plot(gens, series("top1_before_training"), color="#DD8452", label="top-1 agreement, before training on it")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("top-1 agreement", color="#DD8452")
    left.set_title("loss and agreement with new visit counts", fontsize=9)
    speedup = series("speedup_vs_dp")
    right.plot(gens, speedup, color="#55A868", alpha=0.4, label="per generation")
    if len(speedup) >= 5:
        smooth = np.convolve(np.nan_to_num(speedup, nan=1.0), np.ones(5) / 5, mode="valid")
        right.plot(gens[4:], smooth, color="#55A868", label="mean of 5")
    right.set_xlabel("generation")
    right.set_ylabel("speedup over DP-NCCL")
    right.set_title("best plan of the training searches (noisy: new problems each time)", fontsize=9)
    right.legend(fontsize=8)
    return _png(fig)


def loss_curve(points: list, validation: list | None = None, title: str = "training loss") -> bytes:
    """A `tag train` run's loss per step ([step, loss] pairs), with the validation loss at each epoch's end
    ([step, loss] pairs) where there was validation data."""
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(7, 3.4))
    steps, losses = np.array(points, dtype=float).reshape(-1, 2).T
    axis.plot(steps, losses, color="#4C72B0", linewidth=1, label="training loss")
    if validation:
        at, values = np.array(validation, dtype=float).reshape(-1, 2).T
        axis.plot(at, values, "o-", color="#DD8452", label="validation loss (epoch ends)")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    return _png(fig)


SCATTER_BAND = 0.25  # the band drawn around the diagonal: |measured - predicted| / measured within it


def predicted_vs_measured(rows: list[dict], title: str = "predicted against measured step time",
                          highlight: int | None = None, band: float = SCATTER_BAND,
                          by: tuple[str, ...] = ("model", "strategy")) -> bytes:
    """`measured_steps` rows as a scatter: predicted (x) against measured (y) step time in ms, log-log, one colour
    per value of the columns `by`, the interquartile range as a vertical bar, the diagonal and the ±`band` region
    around it; row `highlight` (an index into `rows`) ringed. Rows without a prediction are counted in the title."""
    plt = _pyplot()
    usable = [(i, r) for i, r in enumerate(rows) if _finite(r.get("predicted_s")) and _finite(r.get("measured_s"))
              and r["predicted_s"] > 0 and r["measured_s"] > 0]
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    label_of = lambda r: " / ".join(str(r[c]) for c in by)  # noqa: E731
    labels = sorted({label_of(r) for _, r in usable})
    colors = plt.get_cmap("tab10")
    for k, label in enumerate(labels):
        mine = [r for _, r in usable if label_of(r) == label]
        x = np.array([r["predicted_s"] for r in mine]) * 1e3
        y = np.array([r["measured_s"] for r in mine]) * 1e3
        spread = np.array([r["spread_s"] if _finite(r.get("spread_s")) else 0.0 for r in mine]) * 1e3
        # The IQR as a bar of its own length centred on the median (the quartiles themselves are not stored).
        ax.errorbar(x, y, yerr=np.minimum(spread / 2, y * 0.99), fmt="o", color=colors(k % 10), markersize=5,
                    alpha=0.85, capsize=2, linewidth=0.8, label=label if k < 10 else None)
    values = [v * 1e3 for _, r in usable for v in (r["predicted_s"], r["measured_s"])] or [1.0]
    low, high = min(values) / 1.6, max(values) * 1.6
    line = np.geomspace(low, high, 50)
    ax.plot(line, line, color="#444", linewidth=0.8, label="predicted = measured")
    ax.fill_between(line, line / (1 + band), line / (1 - band), color="#999", alpha=0.15,
                    label=f"within {band:.0%} of measured")
    if highlight is not None and any(i == highlight for i, _ in usable):
        row = rows[highlight]
        ax.scatter([row["predicted_s"] * 1e3], [row["measured_s"] * 1e3], s=160, facecolors="none",
                   edgecolors="#C44E52", linewidths=1.6, label="this measurement", zorder=5)
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain milliseconds, not powers of ten
        axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(which="minor", labelsize=7)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("predicted step (ms)")
    ax.set_ylabel("measured step, median (ms); bar: interquartile range")
    missing = len(rows) - len(usable)
    ax.set_title(title + (f"\n({missing} measurement{'s' * (missing != 1)} without a prediction not shown)"
                          if missing else ""), fontsize=10)
    if len(labels) > 10:
        ax.text(0.02, 0.98, f"{len(labels) - 10} more models / strategies not in the legend", transform=ax.transAxes,
                va="top", fontsize=7)
    ax.legend(fontsize=7, loc="best")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    return _png(fig)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and bool(np.isfinite(value))
