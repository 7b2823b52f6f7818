"""Topology snapshots as JSON: decoding and validating them into a `Topology`.

Errors are one line naming the field's path (`machines[2].count: must be a positive integer`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tag_core.errors import TagInputError
from tag_core.files import UNPAIRED_SURROGATE, unpaired_surrogate

from .fields import RANGES, bounded_number, describe, gpu_count, json_object, nonempty_string, require
from .gpu_catalog import CATALOG_BY_LOWER, GpuType, lookup_gpu
from .hierarchy import Rack, Uplink
from .pair_matrix import PairMatrix, read_matrix, split_document
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
    obj = json_object(data, "", ("name", "machines", "inter_gbps"), ("links", "racks", "uplinks"))
    name = nonempty_string(obj["name"], "name")
    raw_machines = obj["machines"]
    require(isinstance(raw_machines, list), "machines", f"must be a list, got {describe(raw_machines)}")
    require(len(raw_machines) > 0, "machines", "must list at least one machine")
    machines = []
    for i, raw in enumerate(raw_machines):
        where = f"machines[{i}]"
        m = json_object(raw, where, ("name", "gpu", "count", "intra_gbps"), ("rack",))
        machines.append(
            Machine(
                name=nonempty_string(m["name"], f"{where}.name"),
                gpu=_gpu(m["gpu"], f"{where}.gpu"),
                count=gpu_count(m["count"], f"{where}.count"),
                intra_gbps=bounded_number(m["intra_gbps"], f"{where}.intra_gbps", "gbps"),
                rack=nonempty_string(m["rack"], f"{where}.rack") if "rack" in m else None,
            )
        )
    levels = _hierarchy(obj)
    raw_links = obj.get("links", [])
    require(isinstance(raw_links, list), "links", f"must be a list, got {describe(raw_links)}")
    if isinstance(obj["inter_gbps"], (list, PairMatrix)):
        require(not raw_links, "links", "cannot be combined with a per-pair inter_gbps matrix")
        require("racks" not in obj, "inter_gbps", "a per-pair matrix cannot be combined with racks; give one "
                "figure, and links between machines of one rack")
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
            if label.lower() not in spelled:  # the list of names only when it is needed: links x machines
                raise TagInputError(f"{where}.{end}", f"unknown machine {label!r}; known: {', '.join(m.name for m in machines)}")
            ends.append(spelled[label.lower()])
        links.append((ends[0], ends[1], bounded_number(link["gbps"], f"{where}.gbps", "gbps")))
    return Topology(name=name, machines=tuple(machines), inter_gbps=inter, links=tuple(links), **levels)


def _hierarchy(obj: dict) -> dict[str, Any]:
    """`racks` (a list of {name, pod?}) and `uplinks` ({rack, pod?}: {gbps, oversubscription?, latency_us?})
    as Topology's keyword arguments; how they fit the machines is checked by the Topology."""
    out: dict[str, Any] = {}
    if "racks" in obj:
        raw = obj["racks"]
        require(isinstance(raw, list), "racks", f"must be a list, got {describe(raw)}")
        racks = []
        for j, item in enumerate(raw):
            rack = json_object(item, f"racks[{j}]", ("name",), ("pod",))
            pod = nonempty_string(rack["pod"], f"racks[{j}].pod") if "pod" in rack else None
            racks.append(Rack(nonempty_string(rack["name"], f"racks[{j}].name"), pod))
        out["racks"] = tuple(racks)
    if "uplinks" in obj:
        uplinks = json_object(obj["uplinks"], "uplinks", (), ("rack", "pod"))
        for level in ("rack", "pod"):
            if level in uplinks:
                where = f"uplinks.{level}"
                item = json_object(uplinks[level], where, ("gbps",), ("oversubscription", "latency_us"))
                latency = item.get("latency_us")
                out[f"{level}_uplink"] = Uplink(
                    gbps=bounded_number(item["gbps"], f"{where}.gbps", "gbps"),
                    oversubscription=bounded_number(item.get("oversubscription", 1.0), f"{where}.oversubscription",
                                                    "oversubscription"),
                    latency_us=None if latency is None else bounded_number(latency, f"{where}.latency_us", "latency_us"))
    return out


def _inter_matrix(rows: Any, machines: list[Machine]) -> tuple[float, tuple[tuple[str, str, float], ...]]:
    """A per-pair matrix (one row per machine, symmetric, diagonal ignored) as inter_gbps plus links:
    its most common off-diagonal figure becomes inter_gbps, and every other pair a link.
    Vectorised: a 4096-machine matrix has 8.4 million pairs."""
    n = len(machines)
    if isinstance(rows, PairMatrix):
        matrix = rows  # the fast reader only returns an n x n matrix
    else:
        require(len(rows) == n and all(isinstance(r, list) and len(r) == n for r in rows), "inter_gbps",
                f"a per-pair matrix must be {n}x{n}, one row and one column per machine")
        matrix = PairMatrix.from_rows(rows)
    if n == 1:
        return 1.0, ()  # one machine: no inter-machine traffic; any positive figure stands in
    low, high, _ = RANGES["gbps"]
    bad = matrix.first_bad_pair(low, high)
    if bad is not None:  # the pair-by-pair checks of that pair raise the error
        i, j = bad
        gbps = bounded_number(matrix.original(i, j), f"inter_gbps[{i}][{j}]", "gbps")
        lower = matrix.original(j, i)
        require(False, f"inter_gbps[{j}][{i}]",
                f"must equal inter_gbps[{i}][{j}] ({gbps:g}): a link has one bandwidth, got {describe(lower)}")
    inter, link_rows, link_cols = matrix.most_common()
    names = [m.name for m in machines]
    figures = matrix.values[link_rows, link_cols].tolist()
    links = tuple((names[i], names[j], g) for i, j, g in zip(link_rows.tolist(), link_cols.tolist(), figures))
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


class _Constant:
    """What json.loads gives for NaN, Infinity and -Infinity here: a marker whose place names the field."""

    def __init__(self, token: str):
        self.token = token


def _constant_path(value: Any, where: str = "") -> tuple[str, str] | None:
    """(field path, token) of the first NaN/Infinity in document order, or None."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Constant):
            return path or "topology", item.token
        if isinstance(item, dict):
            stack.extend(reversed([(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]))
        elif isinstance(item, list) and any(isinstance(x, (dict, list, _Constant)) for x in item):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(item)]))
    return None


def _decode(data: bytes | str, source: str) -> Any:
    """JSON text as Python values; errors name `source`, or the field for NaN and Infinity."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise TagInputError(source, f"cannot read topology file: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    constants = []

    def constant(token: str) -> _Constant:
        constants.append(token)
        return _Constant(token)

    try:
        parsed = json.loads(text, parse_constant=constant, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, ValueError) as exc:
        raise TagInputError(source, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise TagInputError(source, "not valid JSON: nested too deeply") from None
    if constants:  # Python's json takes NaN and Infinity, which are not JSON: say where the first one is
        where, token = _constant_path(parsed) or (source, constants[0])
        raise TagInputError(where, f"{token} is not valid JSON; give a finite number (in {source})")
    where = unpaired_surrogate(text, parsed)  # a name that cannot be printed or stored
    if where is not None:
        raise TagInputError(where, f"{UNPAIRED_SURROGATE} (in {source})")
    return parsed


def topology_from_json(data: bytes | str, source: str) -> Topology:
    """Decode and validate a snapshot's JSON text (the CLI's files and the sensor's alike); errors name `source`.

    A per-pair matrix is read by `pair_matrix` when it is plain numbers; the rest of the document, and
    any document the fast reader declines, by json."""
    try:
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates in a str: json's own path reports the document
        raw = None
    split = split_document(raw) if raw is not None else None
    if split is not None:
        rest, placeholder, matrix_span = split
        try:
            parsed = _decode(rest, source)
        except TagInputError:
            parsed = None  # the whole file again, so the error's positions are the file's
        if isinstance(parsed, dict) and parsed.get("inter_gbps") == placeholder and isinstance(parsed.get("machines"), list):
            matrix = read_matrix(raw, matrix_span, len(parsed["machines"]))
            if matrix is not None:
                parsed["inter_gbps"] = matrix
                return parse_topology(parsed, source=source)
    return parse_topology(_decode(data, source), source=source)
