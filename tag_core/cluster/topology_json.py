"""Topology snapshots as JSON: decoding and validating them into a `Topology`.

Errors are one line naming the field's path (`machines[2].count: must be a positive integer`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tag_core.errors import TagInputError
from tag_core.files import reject_json_constant

from .fields import bounded_number, describe, gpu_count, is_positive_number, json_object, nonempty_string, require
from .gpu_catalog import CATALOG_BY_LOWER, GpuType, lookup_gpu
from .topology import Machine, Topology


def _gpu(value: Any, where: str) -> GpuType:
    if isinstance(value, str):
        return lookup_gpu(value, where)
    require(isinstance(value, dict), where, f"must be a catalog GPU name or an object, got {describe(value)}")
    obj = json_object(value, where, ("name", "tflops", "mem_gb", "mem_bw_gbps"), ("fp16_tflops",))
    fp16 = obj.get("fp16_tflops")
    gpu = GpuType(
        name=nonempty_string(obj["name"], f"{where}.name"),
        tflops=bounded_number(obj["tflops"], f"{where}.tflops", "tflops"),
        mem_gb=bounded_number(obj["mem_gb"], f"{where}.mem_gb", "mem_gb"),
        mem_bw_gbps=bounded_number(obj["mem_bw_gbps"], f"{where}.mem_bw_gbps", "mem_bw_gbps"),
        fp16_tflops=None if fp16 is None else bounded_number(fp16, f"{where}.fp16_tflops", "tflops"),
    )
    # Profiles are keyed by GPU type name: a catalog name must mean the catalog's figures.
    catalog = CATALOG_BY_LOWER.get(gpu.name.lower())
    require(catalog is None or catalog == gpu, f"{where}.name",
             f"{gpu.name!r} is a catalog GPU with other figures; give just the name, or name yours differently")
    return gpu


def parse_topology(data: Any, source: str = "topology") -> Topology:
    """Validate a JSON-shaped snapshot and build a Topology.

    Errors are TagInputError whose `where` is the field path (e.g. `machines[2].count`);
    `source` names the whole document when it is not an object at all.
    """
    require(isinstance(data, dict), source, f"must be a JSON object, got {describe(data)}")
    obj = json_object(data, "", ("name", "machines", "inter_gbps"), ("links",))
    name = nonempty_string(obj["name"], "name")
    raw_machines = obj["machines"]
    require(isinstance(raw_machines, list), "machines", f"must be a list, got {describe(raw_machines)}")
    require(len(raw_machines) > 0, "machines", "must list at least one machine")
    machines = []
    for i, raw in enumerate(raw_machines):
        where = f"machines[{i}]"
        m = json_object(raw, where, ("name", "gpu", "count", "intra_gbps"))
        machines.append(
            Machine(
                name=nonempty_string(m["name"], f"{where}.name"),
                gpu=_gpu(m["gpu"], f"{where}.gpu"),
                count=gpu_count(m["count"], f"{where}.count"),
                intra_gbps=bounded_number(m["intra_gbps"], f"{where}.intra_gbps", "gbps"),
            )
        )
    raw_links = obj.get("links", [])
    require(isinstance(raw_links, list), "links", f"must be a list, got {describe(raw_links)}")
    if isinstance(obj["inter_gbps"], list):
        require(not raw_links, "links", "cannot be combined with a per-pair inter_gbps matrix")
        inter, pair_links = _inter_matrix(obj["inter_gbps"], machines)
        return Topology(name=name, machines=tuple(machines), inter_gbps=inter, links=pair_links)
    inter = bounded_number(obj["inter_gbps"], "inter_gbps", "gbps")
    # Links name machines case-insensitively; store the spelling used in `machines`.
    spelled = {m.name.lower(): m.name for m in machines}
    links = []
    for j, raw in enumerate(raw_links):
        where = f"links[{j}]"
        link = json_object(raw, where, ("a", "b", "gbps"))
        ends = []
        for end in ("a", "b"):
            label = nonempty_string(link[end], f"{where}.{end}")
            require(label.lower() in spelled, f"{where}.{end}", f"unknown machine {label!r}; known: {', '.join(m.name for m in machines)}")
            ends.append(spelled[label.lower()])
        links.append((ends[0], ends[1], bounded_number(link["gbps"], f"{where}.gbps", "gbps")))
    return Topology(name=name, machines=tuple(machines), inter_gbps=inter, links=tuple(links))


def _inter_matrix(rows: Any, machines: list[Machine]) -> tuple[float, tuple[tuple[str, str, float], ...]]:
    """A per-pair matrix (one row per machine, symmetric, diagonal ignored) as inter_gbps plus links:
    its most common off-diagonal figure becomes inter_gbps, and every other pair a link."""
    n = len(machines)
    require(len(rows) == n and all(isinstance(r, list) and len(r) == n for r in rows), "inter_gbps",
             f"a per-pair matrix must be {n}x{n}, one row and one column per machine")
    if n == 1:
        return 1.0, ()  # one machine: no inter-machine traffic; any positive figure stands in
    pairs = {}
    for i in range(n):
        for j in range(i + 1, n):
            gbps = bounded_number(rows[i][j], f"inter_gbps[{i}][{j}]", "gbps")
            require(is_positive_number(rows[j][i]) and float(rows[j][i]) == gbps, f"inter_gbps[{j}][{i}]",
                     f"must equal inter_gbps[{i}][{j}] ({gbps:g}): a link has one bandwidth, got {describe(rows[j][i])}")
            pairs[(i, j)] = gbps
    figures = sorted(pairs.values())
    inter = max(figures, key=figures.count)  # ties: the smallest of the most common
    links = tuple((machines[i].name, machines[j].name, g) for (i, j), g in pairs.items() if g != inter)
    return inter, links


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    # Python's json keeps the last of repeated keys; a snapshot that repeats one is ambiguous.
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object")
        out[key] = value
    return out


def load_topology(path: str | Path) -> Topology:
    """Read and validate a snapshot file; file-level errors name the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TagInputError(str(p), f"cannot read topology file: {exc.strerror or exc}") from None
    return topology_from_json(data, str(p))


def topology_from_json(data: bytes | str, source: str) -> Topology:
    """Decode and validate a snapshot's JSON text (the CLI's files and the sensor's alike); errors name `source`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise TagInputError(source, f"cannot read topology file: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        parsed = json.loads(text, parse_constant=reject_json_constant, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, ValueError) as exc:
        raise TagInputError(source, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise TagInputError(source, "not valid JSON: nested too deeply") from None
    return parse_topology(parsed, source=source)
