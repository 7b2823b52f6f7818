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
from tag_core.limits import INT32_MAX
from tag_core.simulate.strategy import Strategy


# Lineage fields that go into TEXT columns of `plans`; `tag report` and `tag lineage` print them.
_LINEAGE_TEXT = ("graph_hash", "profile_hash", "groups_hash", "topology_hash", "checkpoint", "code_version",
                 "warm_start_from", "calibration")


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
    if not _non_negative_number(value):
        raise TagInputError(where, f"must be a finite number of seconds >= 0, got {value!r}")


def _non_negative_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


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


def check_stored_fields(plan: PlanFile, where: str) -> None:
    """What check_plan_file leaves to `tag plan`'s own output, but the store's columns and `tag report` read:
    a hand-edited file must fail here, naming the field, not in DuckDB or in every later report."""
    data = plan.data
    batch = data.get("batch_size")
    if not _is_int(batch) or not 0 < batch <= INT32_MAX:
        raise TagInputError(f"{where}: batch_size", f"must be an integer in [1, {INT32_MAX}], got {batch!r}")
    if not _is_int(data.get("groups")) or data["groups"] < 1:
        raise TagInputError(f"{where}: groups",
                            f"must be a positive integer (the op groups), got {data.get('groups')!r}")
    for key in ("speedup_vs_dp_nccl", "ideal_time_s"):
        _number_or_null(data.get(key), f"{where}: {key}")
    for name, baseline in data["baselines"].items():
        field = f"{where}: baselines.{name}"
        if not isinstance(baseline, dict):
            raise TagInputError(field,
                                f"must be an object with iteration_time_s and oom, got {type(baseline).__name__}")
        _number_or_null(baseline.get("iteration_time_s"), f"{field}.iteration_time_s")
        if not isinstance(baseline.get("oom", False), bool):
            raise TagInputError(f"{field}.oom", "must be true or false")
    if data.get("calibration") is not None and not isinstance(data["calibration"], dict):
        raise TagInputError(f"{where}: calibration", "must be an object or null")
    lineage = data["lineage"]
    for key in _LINEAGE_TEXT:
        if lineage.get(key) is not None and not isinstance(lineage[key], str):
            raise TagInputError(f"{where}: lineage.{key}",
                                f"must be a string or null, got {type(lineage[key]).__name__}")
    seed = lineage.get("seed")
    if seed is not None and (not _is_int(seed) or not -INT32_MAX - 1 <= seed <= INT32_MAX):
        raise TagInputError(f"{where}: lineage.seed", f"must be a 32-bit integer or null, got {seed!r}")
    # The strategy must fit the snapshot the file carries (the graph is checked when the plan is used).
    topology = plan.topology
    try:
        plan.strategy.check_machines([m.name for m in topology.machines], topology.name)
        plan.strategy.validate(len(plan.strategy.op_groups), topology.num_machines, topology.num_devices)
    except TagInputError as exc:
        raise TagInputError(f"{where}: strategy: {exc.where}", exc.problem) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_or_null(value: Any, where: str) -> None:
    if value is not None and not _non_negative_number(value):
        raise TagInputError(where, f"must be a finite number >= 0 or null, got {value!r}")
