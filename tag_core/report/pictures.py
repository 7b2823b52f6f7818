"""`plan_pictures`: every picture of one plan, made once from a fresh simulation; the HTML report pages and
the Dagster asset metadata (`deployment_plan`) both show them."""

from __future__ import annotations

from dataclasses import dataclass

from tag_core.cluster.topology import Topology
from tag_core.simulate.strategy import Strategy

from .labels import short_label
from .plan_plots import baseline_bars, folded_gantt, memory_chart
from .plots import placement_heatmap


@dataclass
class PlanPictures:
    """PNG bytes of one plan's pictures."""

    heatmap: bytes  # op groups × the devices they run on
    gantt: bytes  # the simulated iteration on the used devices, idle ones folded into one row
    speedup: bytes  # TAG's speedup over every baseline, with the ideal bound
    memory: bytes  # peak memory of each used device against its capacity

    def named(self) -> dict[str, bytes]:
        """{file stem: PNG} in the order the report page shows them."""
        return {"heatmap": self.heatmap, "gantt": self.gantt, "speedup": self.speedup, "memory": self.memory}


def plan_pictures(graph, profiles, topology: Topology, plan: dict) -> PlanPictures:
    """The pictures of `plan` (its JSON), re-simulated with a timeline from its graph and profiles."""
    from tag_core.simulate.simulator import Simulator

    strategy = Strategy.from_dict(plan["strategy"])
    result = Simulator(graph, topology, profiles, plan["batch_size"]).run(strategy, timeline=True)
    name = f"{short_label(plan['model'], 48, 1)} on {short_label(plan['topology'], 24, 1)}"
    ms = result.iteration_time_s * 1e3
    return PlanPictures(
        heatmap=placement_heatmap(strategy, topology, f"{name}: placement and option per op group"),
        gantt=folded_gantt(result, graph, topology, f"{name}: {ms:.2f} ms per iteration"),
        speedup=baseline_bars(plan, f"{short_label(plan['model'], 40, 1)}: TAG against every baseline"),
        memory=memory_chart(result, topology, f"{short_label(plan['model'], 40, 1)}: peak memory per device"),
    )
