"""The HTML report of all current plans: a table against the baselines, speedup bars, and per plan
the placement heatmap, the simulated Gantt timeline and the lineage; then, when steps were measured
(`measured_steps`), predicted against measured as a scatter and the newest measurement of each."""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tag_core import store
from tag_core.capture.steps import load_op_graph
from tag_core.cluster.topology import Topology
from tag_core.cluster.topology_json import parse_topology
from tag_core.files import write_atomically
from tag_core.runtime.measure import step_error
from tag_core.simulate.strategy import Strategy

from .plots import SCATTER_BAND, gantt, placement_heatmap, predicted_vs_measured, speedup_bars

BASELINE_ORDER = ("dp_nccl", "dp_nccl_p", "horovod", "mcmc")


@dataclass
class PlanPictures:
    heatmap: bytes
    gantt: bytes


def plan_pictures(graph, profiles, topology: Topology, plan: dict) -> PlanPictures:
    """Heatmap and Gantt of one plan, re-simulated (with a timeline) from its graph and profiles."""
    from tag_core.simulate.simulator import Simulator

    strategy = Strategy.from_dict(plan["strategy"])
    result = Simulator(graph, topology, profiles, plan["batch_size"]).run(strategy, timeline=True)
    title = f"{plan['model']} on {plan['topology']}"
    return PlanPictures(placement_heatmap(strategy, topology, title), gantt(result, graph, topology, title))


def plan_table_rows(plans: pd.DataFrame) -> list[dict]:
    rows = []
    for record in plans.to_dict("records"):
        plan = json.loads(record["plan"])
        row = {"model": record["model"], "topology": record["topology"],
               "tag_ms": plan["tag"]["iteration_time_s"] * 1e3,
               "speedup_vs_dp_nccl": plan.get("speedup_vs_dp_nccl"),
               "tag_over_ideal": plan["tag"]["iteration_time_s"] / plan["ideal_time_s"] if plan.get("ideal_time_s") else None,
               "oom": plan["oom"], "created_at": str(record["created_at"])[:19], "plan": plan}
        for name in BASELINE_ORDER:
            baseline = plan["baselines"].get(name)
            row[f"{name}_ms"] = baseline["iteration_time_s"] * 1e3 if baseline and not baseline.get("oom") else None
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """Plain-text table for the terminal."""
    header = ["model", "topology", "TAG ms", "DP-NCCL", "DP-NCCL-P", "Horovod", "MCMC", "speedup", "TAG/ideal"]
    lines = [header]
    for r in rows:
        lines.append([r["model"], r["topology"], _ms(r["tag_ms"])] + [_ms(r[f"{b}_ms"]) for b in BASELINE_ORDER]
                     + [f"{r['speedup_vs_dp_nccl']:.2f}x" if r["speedup_vs_dp_nccl"] else "-",
                        f"{r['tag_over_ideal']:.2f}" if r["tag_over_ideal"] else "-"])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(line, widths)) for line in lines)


def _ms(value) -> str:
    return "OOM" if value is None else f"{value:.2f}"


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def build_report(conn, out_dir: str | Path) -> Path:
    """Write `index.html` (images inline) for every current plan; returns its path."""
    rows = plan_table_rows(store.current_plans(conn))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>TAG plans</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}"
        "img{max-width:100%;border:1px solid #eee;margin:6px 0}pre{background:#f6f6f6;padding:8px}</style>",
        "</head><body><h1>TAG plans</h1>",
    ]
    if not rows:
        parts.append("<p>No plans yet: run <code>tag plan</code> or materialize <code>deployment_plan</code>.</p>")
    else:
        parts.append("<p>Simulated iteration times in milliseconds; speedup is over DP-NCCL.</p><table><tr>"
                     + "".join(f"<th>{h}</th>" for h in ["model", "topology", "TAG", "DP-NCCL", "DP-NCCL-P",
                                                          "Horovod", "MCMC", "speedup", "TAG / ideal", "made"])
                     + "</tr>")
        for r in rows:
            cells = [r["model"], r["topology"], _ms(r["tag_ms"])] + [_ms(r[f"{b}_ms"]) for b in BASELINE_ORDER] + [
                f"{r['speedup_vs_dp_nccl']:.2f}×" if r["speedup_vs_dp_nccl"] else "DP OOM",
                f"{r['tag_over_ideal']:.2f}" if r["tag_over_ideal"] else "-", r["created_at"]]
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
        parts.append(_image(speedup_bars(rows), "speedup bars"))
        for r in rows:
            plan = r["plan"]
            snapshot = store.latest_topology_snapshot(conn, r["topology"])
            parts.append(f"<h2>{html.escape(r['model'])} on {html.escape(r['topology'])}</h2>")
            if snapshot is None:
                parts.append("<p>(the topology snapshot is not recorded; no pictures)</p>")
            else:
                topology = parse_topology(snapshot["snapshot"], source=r["topology"])
                graph = load_op_graph(conn, plan["model"])
                pictures = plan_pictures(graph, store.load_profiles(conn, plan["model"]), topology, plan)
                parts.append(_image(pictures.heatmap, "placement heatmap") + _image(pictures.gantt, "timeline"))
            parts.append(f"<pre>{html.escape(json.dumps(plan.get('lineage', {}), indent=1))}</pre>")
    parts += measured_section(store.load_measured_steps(conn))
    parts.append("</body></html>")
    path = Path(out_dir) / "index.html"
    write_atomically(path, "\n".join(parts))
    return path


def measured_section(measured: pd.DataFrame) -> list[str]:
    """HTML for the measured steps (newest first, as `store.load_measured_steps` gives them): the scatter of
    every measurement and a table of the newest of each model, topology and strategy; nothing without rows."""
    if measured.empty:
        return []
    rows = [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in measured.to_dict("records")]
    newest = measured.drop_duplicates(["model", "topology", "strategy"]).to_dict("records")
    parts = [f"<h2>Predicted against measured</h2><p>{len(rows)} measured steps (<code>tag run --measure</code>, "
             f"<code>tag fidelity</code>, the <code>measured_step</code> asset): the median of the timed steps "
             f"against the simulator's prediction. Error is (predicted − measured) / measured; the band is "
             f"±{SCATTER_BAND:.0%}.</p>",
             _image(predicted_vs_measured(rows, by=("model", "topology", "strategy")), "predicted against measured"),
             "<table><tr>" + "".join(f"<th>{h}</th>" for h in ["model", "topology", "strategy", "predicted ms",
                                                                 "measured ms", "IQR ms", "error", "steps",
                                                                 "measured"]) + "</tr>"]
    for r in newest:
        predicted, error = None if pd.isna(r["predicted_s"]) else r["predicted_s"], step_error(r)
        cells = [r["model"], r["topology"], r["strategy"], f"{predicted * 1e3:.2f}" if predicted else "-",
                 f"{r['measured_s'] * 1e3:.2f}", "-" if pd.isna(r["spread_s"]) else f"{r['spread_s'] * 1e3:.2f}",
                 "-" if error is None else f"{error:+.1%}", r["steps"], str(r["measured_at"])[:19]]
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    return parts
