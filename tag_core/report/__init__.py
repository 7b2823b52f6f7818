"""Pictures and the HTML report of the current plans.

In: plans from the store, with their graphs, profiles and topologies.
Out: PNG pictures (placement heatmap, Gantt timeline of the used devices, speedup bars against every
baseline, memory per device, the GNN's training curve) and an HTML report: an index with a table
against the baselines, and one page per model × topology with its pictures and lineage.
"""

from .html import build_report, format_table, plan_table_rows
from .labels import page_stem, short_label
from .pictures import PlanPictures, plan_pictures
from .plan_plots import baseline_bars, folded_gantt, memory_chart
from .plots import gantt, loss_curve, markdown_image, placement_heatmap, speedup_bars, training_curve

__all__ = [
    "PlanPictures", "baseline_bars", "build_report", "folded_gantt", "format_table", "gantt", "loss_curve", "markdown_image",
    "memory_chart", "page_stem", "placement_heatmap", "plan_pictures", "plan_table_rows", "short_label",
    "speedup_bars", "training_curve",
]
