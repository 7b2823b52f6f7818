"""A plan JSON file read back: checked field by field, with the topology snapshot it carries.

`tag plan` writes `topology_snapshot` ({hash, snapshot}) into every plan, so a plan file stands
alone: `tag plans import` stores it and needs nothing else. A file whose snapshot was edited by
hand no longer matches its hash, and is refused naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from tag_core.cluster.topology import Topology
from tag_core.cluster.topology_json import parse_topology
from tag_core.errors import TagInputError
from tag_core.simulate.strategy import Strategy


@dataclass
class PlanFile:
    data: dict[str, Any]
    strategy: Strategy
    topology: Topology

    @property
    def plan_id(self) -> str:
        return plan_id(self.data)


def plan_id(data: dict[str, Any]) -> str:
    """16 hex chars of the plan's canonical JSON: the same plan imported twice is one row."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_plan_file(data: Any, where: str) -> PlanFile:
    """`data` (a parsed plan JSON) as a PlanFile; TagInputError naming `where: field` otherwise."""
    if not isinstance(data, dict):
        raise TagInputError(where, f"must be a plan JSON object (from `tag plan --out`), got {type(data).__name__}")
    for key in ("model", "topology"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise TagInputError(f"{where}: {key}", "must be a non-empty string")
    for key in ("tag", "baselines", "lineage", "strategy", "topology_snapshot"):
        if not isinstance(data.get(key), dict):
            raise TagInputError(f"{where}: {key}", "must be an object" if key in data else "is missing")
    _time(data["tag"].get("iteration_time_s"), f"{where}: tag.iteration_time_s")
    dp = data["baselines"].get("dp_nccl")
    _time(dp.get("iteration_time_s") if isinstance(dp, dict) else None, f"{where}: baselines.dp_nccl.iteration_time_s")
    if not isinstance(data.get("oom"), bool):
        raise TagInputError(f"{where}: oom", "must be true or false")
    try:
        strategy = Strategy.from_dict(data["strategy"])
    except TagInputError as exc:
        raise TagInputError(f"{where}: strategy: {exc.where}", exc.problem) from None
    return PlanFile(data, strategy, _carried_topology(data, where))


def _time(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise TagInputError(where, f"must be a finite number of seconds >= 0, got {value!r}")


def _carried_topology(data: dict[str, Any], where: str) -> Topology:
    carried = data["topology_snapshot"]
    field = f"{where}: topology_snapshot"
    if not isinstance(carried.get("hash"), str):
        raise TagInputError(f"{field}.hash", "must be the snapshot's content hash (a string)")
    try:
        topology = parse_topology(carried.get("snapshot"), source=f"{field}.snapshot")
    except TagInputError as exc:  # field paths inside the snapshot come without the file's
        inside = exc.where.startswith(f"{field}.snapshot")
        raise TagInputError(exc.where if inside else f"{field}.snapshot.{exc.where}", exc.problem) from None
    actual = topology.content_hash()
    if actual != carried["hash"]:
        raise TagInputError(f"{field}.snapshot", f"hashes to {actual}, not the {carried['hash']} the plan was made "
                                                 "for: the snapshot was changed after planning")
    recorded = data["lineage"].get("topology_hash")
    if recorded is not None and recorded != actual:
        raise TagInputError(f"{where}: lineage.topology_hash", f"is {recorded}, but the carried snapshot hashes to "
                                                               f"{actual}")
    if topology.name != data["topology"]:
        raise TagInputError(f"{where}: topology", f"is {data['topology']!r}, but the carried snapshot is named "
                                                  f"{topology.name!r}")
    return topology
