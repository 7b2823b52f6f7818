"""The HTML report of all current plans: `index.html` with a table against the baselines (each plan linking
to its page), speedup bars and, when steps were measured (`measured_steps`), predicted against measured as a
scatter and the newest measurement of each; then one page per model × topology under `plans/` (see `pages`),
its pictures as PNG files beside it."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from tag_core import store
from tag_core.capture.steps import load_op_graph
from tag_core.cluster.topology_json import parse_topology
from tag_core.files import staged_folder, write_atomically
from tag_core.runtime.measure import step_error

from .labels import page_stem
from .pages import STYLE, PageFacts, name_cell, plan_page
from .pictures import PlanPictures, plan_pictures
from .plots import SCATTER_BAND, predicted_vs_measured, speedup_bars

BASELINE_ORDER = ("dp_nccl", "dp_nccl_p", "horovod", "mcmc")
PAGES = "plans"  # the folder of the plan pages, under the report's folder

__all__ = ["BASELINE_ORDER", "PlanPictures", "build_report", "format_table", "measured_section", "page_facts",
           "plan_pictures", "plan_table_rows"]


def plan_table_rows(plans: pd.DataFrame) -> list[dict]:
    rows = []
    for record in plans.to_dict("records"):
        plan = json.loads(record["plan"])
        row = {"model": record["model"], "topology": record["topology"],
               "tag_ms": plan["tag"]["iteration_time_s"] * 1e3,
               "speedup_vs_dp_nccl": plan.get("speedup_vs_dp_nccl"),
               "tag_over_ideal": plan["tag"]["iteration_time_s"] / plan["ideal_time_s"] if plan.get("ideal_time_s") else None,
               "oom": plan["oom"], "created_at": str(record["created_at"])[:19], "plan": plan,
               "plan_id": record.get("plan_id", "")}
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


def page_facts(conn, row: dict) -> PageFacts:
    """The lineage a plan's page shows, from its JSON and the store (snapshot, profiles, calibration, history)."""
    plan = row["plan"]
    lineage = plan.get("lineage", {})
    history = store.plan_lineage(conn, row["model"], row["topology"])
    mine = history[history.plan_id == row["plan_id"]].to_dict("records")
    carried = plan.get("topology_snapshot") or {}
    latest = store.latest_topology_snapshot(conn, row["topology"])
    snapshot_json = carried.get("snapshot") or (latest or {}).get("snapshot")
    snapshot = {"hash": carried.get("hash") or (latest or {}).get("content_hash"),
                "file": mine[0]["snapshot_file"] if mine else (latest or {}).get("source_file"),
                "recorded_at": str(mine[0]["snapshot_recorded_at"])[:19] if mine else None,
                "json": snapshot_json}
    if snapshot_json:
        snapshot["machines"] = len(snapshot_json.get("machines", []))
        snapshot["devices"] = sum(m.get("count", 0) for m in snapshot_json.get("machines", []))
    profiles = store.profile_summary(conn, row["model"]).to_dict("records")
    calibration = store.load_calibration(conn, lineage["calibration"]) if lineage.get("calibration") else None
    return PageFacts(row=row, plan_id=row["plan_id"], snapshot=snapshot, profiles=profiles, calibration=calibration,
                     history=history.to_dict("records"),
                     missing="" if snapshot_json else "The topology snapshot is not recorded: no pictures.")


def write_plan_page(folder: Path, facts: PageFacts, pictures: PlanPictures | None) -> Path:
    """`<stem>.html` and its `<stem>-<picture>.png` files in `folder`; returns the page's path."""
    stem = page_stem(facts.row["model"], facts.row["topology"])
    images = {}
    for name, png in (pictures.named() if pictures else {}).items():
        write_atomically(folder / f"{stem}-{name}.png", png)
        images[name] = f"{stem}-{name}.png"
    path = folder / f"{stem}.html"
    write_atomically(path, plan_page(facts, images))
    return path


def build_report(conn, out_dir: str | Path) -> Path:
    """Write `index.html`, `speedup.png` and a page per current plan under `plans/`; returns the index's path.
    Nothing reaches `out_dir` unless every page was made."""
    out_dir = Path(out_dir)
    with staged_folder(out_dir) as staging:
        _write_report(conn, staging)
    return out_dir / "index.html"


def _write_report(conn, out_dir: Path) -> None:
    rows = plan_table_rows(store.current_plans(conn))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>TAG plans</title><style>{STYLE}</style>",
             "</head><body><h1>TAG plans</h1>"]
    if not rows:
        parts.append("<p>No plans yet: run <code>tag plan</code> or materialize <code>deployment_plan</code>.</p>")
    else:
        parts.append(f"<p>{len(rows)} current plan{'s' * (len(rows) != 1)}, one page each (the model links to it): "
                     "simulated iteration times in milliseconds; speedup is over DP-NCCL.</p><table><tr>"
                     + "".join(f"<th{' class=name' * (h in ('model', 'topology'))}>{h}</th>"
                               for h in ["model", "topology", "TAG", "DP-NCCL", "DP-NCCL-P", "Horovod", "MCMC",
                                         "speedup", "TAG / ideal", "made"]) + "</tr>")
        for r in rows:
            page = write_plan_page(out_dir / PAGES, page_facts(conn, r), _pictures(conn, r))
            cells = [_ms(r["tag_ms"])] + [_ms(r[f"{b}_ms"]) for b in BASELINE_ORDER] + [
                f"{r['speedup_vs_dp_nccl']:.2f}×" if r["speedup_vs_dp_nccl"] else "DP OOM",
                f"{r['tag_over_ideal']:.2f}" if r["tag_over_ideal"] else "-", r["created_at"]]
            parts.append("<tr>" + name_cell(r["model"], f"{PAGES}/{page.name}") + name_cell(r["topology"])
                         + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
        write_atomically(out_dir / "speedup.png", speedup_bars(rows))
        parts.append("<figure><img src='speedup.png' alt='TAG speedup over DP-NCCL per model and topology'>"
                     "<figcaption>Hover a model in the table for its full name; long names are shortened in the "
                     "chart.</figcaption></figure>")
    parts += measured_section(store.load_measured_steps(conn))
    parts.append("</body></html>")
    write_atomically(out_dir / "index.html", "\n".join(parts))


def _pictures(conn, row: dict) -> PlanPictures | None:
    plan = row["plan"]
    carried = (plan.get("topology_snapshot") or {}).get("snapshot")
    snapshot = carried or (store.latest_topology_snapshot(conn, row["topology"]) or {}).get("snapshot")
    if snapshot is None:
        return None
    topology = parse_topology(snapshot, source=row["topology"])
    return plan_pictures(load_op_graph(conn, plan["model"]), store.load_profiles(conn, plan["model"]), topology, plan)


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
