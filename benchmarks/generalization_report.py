"""Markdown and figures for benchmarks/generalization.py (kept apart so the runner stays short)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_topologies(part: dict, path: Path, cap: int = 200) -> None:
    """Empirical CDF of MCTS iterations to beat DP-NCCL, GNN vs uniform priors."""
    plt = _pyplot()
    rows = [r for r in part["rows"] if "skipped" not in r]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, color in (("gnn", "#4C72B0"), ("uniform", "#DD8452")):
        its = np.sort([r[key] if r[key] is not None else cap + 1 for r in rows])
        ax.step(its, np.arange(1, len(its) + 1) / len(its), where="post", label=key, color=color)
    ax.set_xscale("log")
    ax.set_xlim(0.9, cap + 2)
    ax.set_xlabel(f"MCTS iterations until a plan beats DP-NCCL (>{cap}: not found)")
    ax.set_ylabel("share of random topologies")
    ax.legend()
    ax.set_title(f"{len(rows)} unseen random topologies")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def figure_models(part: dict, path: Path, cap: int = 200) -> None:
    """Left: plan time of the unseen (and uniform) over the seen network. Right: iterations to beat DP-NCCL."""
    plt = _pyplot()
    rows = part["rows"]
    labels = [f"{r['model']}\n{r['topology']}" for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 4.2), gridspec_kw={"wspace": 0.18})
    x = np.arange(len(rows))
    left.bar(x - 0.2, [r["unseen"] / r["seen"] for r in rows], 0.4, label="unseen / seen", color="#4C72B0")
    left.bar(x + 0.2, [r["uniform"] / r["seen"] for r in rows], 0.4, label="uniform / seen", color="#DD8452")
    left.axhline(1.05, color="grey", linestyle="--", linewidth=1, label="goal: within 5%")
    left.set_ylim(0.9, 1.1)
    left.set_ylabel("plan time relative to the seen network")
    left.set_title(f"plan() with {part.get('iterations', '?')} MCTS iterations", fontsize=9)
    keys = [("seen", "#55A868"), ("unseen", "#4C72B0"), ("uniform", "#DD8452")]
    for i, (key, color) in enumerate(keys):
        its = [r.get(f"{key}_beat_dp_it") or cap * 1.5 for r in rows]
        right.bar(x + (i - 1) * 0.27, its, 0.27, label=key, color=color)
    right.set_yscale("log")
    right.axhline(cap, color="grey", linestyle=":", linewidth=1, label=f"cap {cap} (bars above: not found)")
    right.set_ylabel("MCTS iterations to beat DP-NCCL (DP-NCCL space)")
    for ax in (left, right):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7, rotation=60, ha="right")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _r(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def write_markdown(data: dict, path: Path) -> None:
    lines = ["# GNN generalisation (`benchmarks/generalization.py`)", ""]
    notes = data.get("notes", {})
    topo = data.get("topologies")
    if topo:
        s = topo["summary"]
        lines += [
            "## Unseen topologies (TAG paper Table VII)", "",
            f"{s['cases']} random topologies (seeds from 1,000,000; training used seeds 0-63), a random zoo model "
            f"each; MCTS in the DP-NCCL strategy space until a plan beats DP-NCCL, cap 200. "
            f"Checkpoint `{topo['checkpoint']}`; {topo['wall_s'] / 60:.1f} min. Figure: "
            "`generalization_topologies.png`.", "",
            "| prior, cases | median | mean | p90 | found at iteration 1 | not found in 200 | median wall s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        subsets = [("all", s)] + ([("2+ machines", s["multi_machine"])] if "multi_machine" in s else [])
        for label, sub in subsets:
            for key in ("gnn", "uniform"):
                v = sub[key]
                lines.append(f"| {key}, {label} ({sub['cases']}) | {v['median']:g} | {v['mean']:.1f} | {v['p90']:.1f} "
                             f"| {v['first_iteration']} | {v['not_found']} | {v.get('median_wall_s', float('nan')):.2f} |")
        ratio = s["uniform"]["median"] / max(s["gnn"]["median"], 1e-9)
        lines += ["", f"Goal (GNN median at most 1/5 of uniform's): **{'met' if s['goal_met'] else 'not met'}** "
                      f"(uniform/GNN median ratio {ratio:.2f}). GNN inference: "
                      f"{s['gnn_inference_ms_per_call']:.1f} ms per MCTS node expansion.", ""]
        if notes.get("topologies"):
            lines += [notes["topologies"], ""]
    models = data.get("models")
    if models:
        lines += [
            "## Unseen models (TAG paper Table VIII)", "",
            f"Leave-one-out networks ({models['generations']} generations each, same seed) against one trained on "
            f"all six; `plan()` with {models['iterations']} MCTS iterations. Figure: `generalization_models.png`.", "",
            "| model | topology | DP-NCCL ms | seen ms | unseen ms | unseen / seen | uniform ms | shipped (40 gen.) ms |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in models["rows"]:
            lines.append(f"| {r['model']} | {r['topology']} | {r['dp_nccl'] * 1e3:.2f} | {r['seen'] * 1e3:.2f} | "
                         f"{r['unseen'] * 1e3:.2f} | {r['unseen_over_seen']:.3f} | {r['uniform'] * 1e3:.2f} | "
                         f"{r.get('shipped', float('nan')) * 1e3:.2f} |")
        lines += ["", "MCTS iterations to beat DP-NCCL in the DP-NCCL strategy space (Table VII's measure; '-': not "
                      "within 200):", "", "| model | topology | seen | unseen | uniform | shipped |", "|---|---|---:|---:|---:|---:|"]
        for r in models["rows"]:
            cells = [r.get(f"{k}_beat_dp_it") for k in ("seen", "unseen", "uniform", "shipped")]
            lines.append(f"| {r['model']} | {r['topology']} | " + " | ".join("-" if c is None else str(c) for c in cells)
                         + " |")
        lines += ["", f"Worst unseen/seen {models['max_ratio']:.3f}, mean {models['mean_ratio']:.3f}; goal (within 5%): "
                      f"**{'met' if models['goal_met'] else 'not met'}**. {models['wall_s'] / 60:.1f} min.", ""]
        if notes.get("models"):
            lines += [notes["models"], ""]
    costs = data.get("costs")
    if costs:
        m = costs.get("metrics", {})
        wall = costs.get("training_wall_s") or 0.0
        lines += [
            "## Costs", "",
            f"- checkpoint `{costs['checkpoint']}`: {costs['checkpoint_bytes'] / 1e6:.2f} MB "
            f"({costs['parameters']:,} parameters, Adam state included)",
            f"- training: {wall / 60:.1f} min on one CPU thread, {costs['generations']} generations, "
            f"{costs['episodes']} MCTS searches, {costs['examples']} examples",
            f"- final training metrics (mean of the last 5 generations): loss {_r(m.get('loss'))}, top-1 agreement "
            f"with new visit counts {_r(m.get('top1_before_training'))}, speedup over DP-NCCL of the training "
            f"searches' best plans {_r(m.get('speedup_vs_dp'))}",
            "",
        ]
        inf = costs.get("inference", [])
        if inf:
            lines += ["| model | topology | groups | actions | featurize ms | network ms | per-problem setup ms |",
                      "|---|---|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['model']} | {r['topology']} | {r['groups']} | {r['actions']} | {r['featurize_ms']:.2f} | "
                      f"{r['network_ms']:.2f} | {r['static_features_ms']:.0f} |" for r in inf]
            lines.append("")
        if notes.get("costs"):
            lines += [notes["costs"], ""]
    rss = data.get("peak_rss_mib", {})
    if rss:
        lines += ["Peak RSS (MiB) per part: " + ", ".join(f"{k} {v:.0f}" for k, v in rss.items()), ""]
    path.write_text("\n".join(lines))
