"""The HTML of one plan's report page: what the plan is worth against the baselines, its pictures, and
its lineage (snapshot, profiles, GNN checkpoint, calibration, earlier plans). Pure rendering: the facts
come in as plain dicts (`html.page_facts` reads them from the store)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

from .labels import short_label

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}"
    "h1{font-size:1.5em;overflow-wrap:anywhere}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;"
    "vertical-align:top;white-space:nowrap}th{background:#f4f4f4}td.name,th.name{text-align:left}"
    "table.facts td{text-align:left;white-space:normal;overflow-wrap:anywhere;max-width:40em}table.facts td:first-child{color:#555;"
    "white-space:nowrap}figure{margin:1em 0}figcaption{color:#555;font-size:.9em}"
    "img{max-width:100%;border:1px solid #eee}nav{font-size:.9em;margin-bottom:1em}code{font-size:.92em}"
    ".grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}@media(max-width:900px){.grid{grid-template-columns:1fr}}"
)

CAPTIONS = {
    "speedup": "TAG's simulated speedup over each baseline (log scale); the grey bar is the ideal bound: the "
               "baseline against an iteration of compute only, split perfectly over every device.",
    "memory": "Peak memory of each device the plan uses against its capacity; idle devices share the last row.",
    "heatmap": "Where each op group runs and with which option; devices that run no group share the last column.",
    "gantt": "The simulated iteration: a compute and a communication lane per device the plan uses; "
             "idle devices are folded into one row.",
}


@dataclass
class PageFacts:
    """What a plan page shows besides its pictures."""

    row: dict  # a `plan_table_rows` row (its `plan` is the plan JSON)
    plan_id: str = ""
    snapshot: dict = field(default_factory=dict)  # {hash, file, recorded_at, machines, devices}
    profiles: list[dict] = field(default_factory=list)  # `store.profile_summary` rows of the plan's model
    calibration: dict | None = None  # the stored calibration the plan used, when it used one
    history: list[dict] = field(default_factory=list)  # `store.plan_lineage` rows, oldest first
    missing: str = ""  # why there are no pictures, when there are none


def plan_title(row: dict) -> str:
    return f"{row['model']} on {row['topology']}"


def name_cell(text: str, href: str | None = None, width: int = 40) -> str:
    """A table cell with a name shortened to two lines, the full name as its title (shown on hover)."""
    short = html.escape(short_label(text, width)).replace("\n", "<br>")
    inner = f'<a href="{html.escape(href)}" title="{html.escape(text)}">{short}</a>' if href else short
    return f'<td class="name" title="{html.escape(text)}">{inner}</td>'


def facts_table(pairs: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_text(v))}</td></tr>" for k, v in pairs)
    return f'<table class="facts">{cells}</table>'


def plan_page(facts: PageFacts, images: dict[str, str], index_href: str = "../index.html") -> str:
    """The page of one plan; `images` maps a picture's name (`PlanPictures.named`) to its src."""
    row, plan = facts.row, facts.row["plan"]
    title = plan_title(row)
    speedup = row["speedup_vs_dp_nccl"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>",
             f'<nav><a href="{html.escape(index_href)}">← all plans</a></nav>',
             f"<h1 title='{html.escape(title)}'>{html.escape(row['model'])} <small>on</small> "
             f"{html.escape(row['topology'])}</h1>",
             f"<p>Batch {plan['batch_size']}, {plan['groups']} op groups. TAG's simulated iteration: "
             f"<b>{row['tag_ms']:.3f} ms</b>, "
             + (f"<b>{speedup:.2f}×</b> faster than DP-NCCL" if speedup else "DP-NCCL runs out of memory")
             + (f", {row['tag_over_ideal']:.1f}× the ideal bound" if row["tag_over_ideal"] else "")
             + (". <b style='color:#C44E52'>The plan runs out of memory.</b>" if plan["oom"] else ".")
             + f" Made {html.escape(row['created_at'])}.</p>"]
    if facts.missing:
        parts.append(f"<p>{html.escape(facts.missing)}</p>")
    order = [("speedup", "Against every baseline"), ("memory", "Memory per device"),
             ("heatmap", "Placement"), ("gantt", "Simulated iteration")]
    figures = [(heading, f"<figure><img src='{html.escape(images[name])}' alt='{html.escape(f'{heading}: {title}')}' "
                         f"title='{html.escape(title)}'><figcaption>{html.escape(CAPTIONS[name])}</figcaption></figure>")
               for name, heading in order if name in images]
    if len(figures) == len(order):  # the two small charts side by side, the wide ones below
        parts.append("<div class='grid'>" + "".join(f"<div><h2>{h}</h2>{f}</div>" for h, f in figures[:2]) + "</div>")
        figures = figures[2:]
    parts += [f"<h2>{h}</h2>{f}" for h, f in figures]
    parts += lineage_section(facts)
    parts.append("</body></html>")
    return "\n".join(parts)


def lineage_section(facts: PageFacts) -> list[str]:
    plan = facts.row["plan"]
    lineage, calibration = plan.get("lineage", {}), plan.get("calibration") or {}
    parts = ["<h2>Lineage</h2>", "<div class='grid'><div><h3>Plan</h3>", facts_table([
        ("plan id", facts.plan_id), ("code version", lineage.get("code_version")), ("seed", lineage.get("seed")),
        ("search budget", lineage.get("budget")), ("warm start from", lineage.get("warm_start_from")),
        ("graph hash", lineage.get("graph_hash")), ("op groups hash", lineage.get("groups_hash")),
    ]), "<h3>Topology snapshot</h3>", facts_table([
        ("hash", lineage.get("topology_hash") or facts.snapshot.get("hash")), ("file", facts.snapshot.get("file")),
        ("recorded", facts.snapshot.get("recorded_at")), ("machines", facts.snapshot.get("machines")),
        ("devices", facts.snapshot.get("devices")),
    ]), "</div><div><h3>GNN checkpoint</h3>", facts_table([
        ("priors", lineage.get("prior")), ("checkpoint", lineage.get("checkpoint")),
        ("file", lineage.get("checkpoint_file")),
    ]), "<h3>Calibration</h3>", facts_table([
        ("applied", calibration.get("applied")), ("hash", lineage.get("calibration")),
        ("why", calibration.get("why")),
    ] + ([("made", facts.calibration.get("created_at")), ("terms", facts.calibration.get("terms"))]
         if facts.calibration else [])), "</div></div>",
        f"<h3>Profiles</h3><p>Profile set hash <code>{html.escape(_text(lineage.get('profile_hash')))}</code>.</p>"]
    if facts.profiles:
        columns = ["device_type", "batch_size", "ops", "runs", "step_op_time_us", "measured_step_us"]
        present = [c for c in columns if c in facts.profiles[0]]
        parts.append("<table><tr>" + "".join(f"<th>{c.replace('_', ' ')}</th>" for c in present) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{html.escape(_text(p.get(c)))}</td>" for c in present)
                               + "</tr>" for p in facts.profiles) + "</table>")
    if facts.history:
        parts.append(f"<h3>Plans of this model and topology ({len(facts.history)})</h3><table><tr>"
                     + "".join(f"<th>{h}</th>" for h in ["made", "plan id", "source", "TAG ms", "speedup", "seed",
                                                          "graph current", "snapshot file"]) + "</tr>")
        for h in facts.history:
            mark = " ◀ this plan" if h.get("plan_id") == facts.plan_id else ""
            speedup = h.get("speedup_vs_dp_nccl")
            cells = [str(h.get("created_at"))[:19], f"{h.get('plan_id')}{mark}", h.get("source"),
                     f"{h['tag_time_s'] * 1e3:.3f}" if h.get("tag_time_s") is not None else "-",
                     f"{speedup:.2f}×" if _number(speedup) else "-", h.get("seed"), h.get("graph_is_current"),
                     h.get("snapshot_file")]
            parts.append("<tr>" + "".join(f"<td>{html.escape(_text(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    return parts


def _number(value) -> bool:
    return isinstance(value, (int, float)) and value == value  # not None, not NaN


def _text(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
