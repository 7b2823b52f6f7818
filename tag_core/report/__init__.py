"""Pictures and the HTML report of the current plans.

In: plans from the store, with their graphs, profiles and topologies.
Out: PNG pictures (placement heatmap, Gantt timeline, speedup bars, the GNN's training curve) and
an HTML report with a table against the baselines and each plan's lineage.
"""

from .html import PlanPictures, build_report, format_table, plan_pictures, plan_table_rows
from .plots import gantt, markdown_image, placement_heatmap, speedup_bars, training_curve

__all__ = [
    "PlanPictures", "build_report", "format_table", "gantt", "markdown_image", "placement_heatmap",
    "plan_pictures", "plan_table_rows", "speedup_bars", "training_curve",
]
