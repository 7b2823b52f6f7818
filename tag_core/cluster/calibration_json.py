"""Calibrations as JSON files: export, and a strict import that names the field of any problem.

The file (format "tag-calibration", version 1):

    {"format": "tag-calibration", "version": 1, "topology": NAME, "topology_hash": 16 hex,
     "calibration_hash": 16 hex (optional on import; checked against the terms when given),
     "source", "host", "code_version",
     "links": {"inter": FIT, "intra": FIT, "client": FIT},   (each optional; at least one)
     "collectives": {"allreduce" | "ps" | "broadcast": {"inter" | "intra": {"<group size>": FIT}}},
     "overheads": {"per_op_s", "per_step_s", "per_transfer_s",
                   "compute_overlap" (optional, 0 to 1), "transfer_gap_s", "busy_send_s" (optional)},
     "samples": [{"kind", "link", "group_size", "bytes", "run", "seconds"}, ...]}

    FIT = {"latency_s", "gbps", "residual_rms_s", "residual_max_rel", "samples"}

Errors are TagInputErrors whose `where` is the field's path (`links.inter.gbps`), so a file that is
refused writes nothing.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from tag_core.errors import TagInputError
from tag_core.files import read_json, write_atomically
from tag_core.limits import INT32_MAX, INT64_MAX

from .calibration import COLLECTIVES, KINDS, LINKS, OPTIONAL_OVERHEADS, SOURCES, Calibration, Fit, Overheads, Sample
from .fields import bounded_number, describe, field_path, json_object, require

FORMAT = "tag-calibration"
VERSION = 1
MAX_SECONDS = 1e4  # far beyond any step; keeps the cost model's arithmetic finite
_HASH = re.compile(r"^[0-9a-f]{16}$")
_FIT_KEYS = ("latency_s", "gbps", "residual_rms_s", "residual_max_rel", "samples")
_TOP_KEYS = ("format", "version", "topology", "topology_hash", "source", "host", "code_version", "links",
             "collectives", "overheads", "samples")


def calibration_to_json(calibration: Calibration) -> dict:
    samples = [{"kind": s.kind, "link": s.link, "group_size": s.group_size, "bytes": s.bytes, "run": s.run,
                "seconds": s.seconds} for s in calibration.samples]
    return {"format": FORMAT, "version": VERSION, "topology": calibration.topology,
            "topology_hash": calibration.topology_hash, "calibration_hash": calibration.calibration_hash,
            "source": calibration.source, "host": calibration.host, "code_version": calibration.code_version,
            **calibration.terms(), "samples": samples}


def write_calibration_file(calibration: Calibration, path: str | Path, where: str = "--export") -> None:
    text = json.dumps(calibration_to_json(calibration), indent=1, allow_nan=False) + "\n"
    write_atomically(path, text, make_parents=False, where=where)


def read_calibration_file(path: str | Path, where: str = "--import") -> Calibration:
    """A calibration file, validated; it arrives with source "import". Errors name `where`, the file and
    the field."""
    data = read_json(path, where)
    try:
        return parse_calibration(data)
    except TagInputError as exc:
        raise TagInputError(f"{where} {path}: {exc.where}", exc.problem) from None


def parse_calibration(data: Any) -> Calibration:
    require(isinstance(data, dict), "calibration", f"must be a JSON object, got {describe(data)}")
    obj = json_object(data, "", _TOP_KEYS, ("calibration_hash",))
    require(obj["format"] == FORMAT, "format", f"must be {FORMAT!r}, got {describe(obj['format'])}")
    version = obj["version"]
    require(_is_int(version), "version", f"must be an integer, got {describe(version)}")
    require(version == VERSION, "version", f"unsupported version {version} (this TAG reads version {VERSION})")
    topology = _string(obj["topology"], "topology", empty=False)
    topology_hash = _hash(obj["topology_hash"], "topology_hash")
    _choice(obj["source"], "source", SOURCES)
    host = _string(obj["host"], "host")
    code_version = _string(obj["code_version"], "code_version")
    links, collectives, overheads = parse_terms({k: obj[k] for k in ("links", "collectives", "overheads")}, "")
    samples = _samples(obj["samples"], "samples")
    calibration = Calibration(topology=topology, topology_hash=topology_hash, source="import", host=host,
                              code_version=code_version, links=links, collectives=collectives, overheads=overheads,
                              samples=samples)
    if "calibration_hash" in obj:
        given = _hash(obj["calibration_hash"], "calibration_hash")
        require(given == calibration.calibration_hash, "calibration_hash",
                f"{given} does not match the file's terms and topology_hash ({calibration.calibration_hash}); "
                "the file was changed after export")
    return calibration


def parse_terms(terms: Any, where: str) -> tuple[dict[str, Fit], dict[str, dict[str, dict[int, Fit]]], Overheads]:
    """The links, collectives and overheads of a calibration (`where` "" in a file, "terms" in the store)."""
    require(isinstance(terms, dict), where or "terms", f"must be a JSON object, got {describe(terms)}")
    json_object(terms, where, ("links", "collectives", "overheads"))
    raw_links = _object(terms["links"], field_path(where, "links"))
    links = {}
    for link, fit in raw_links.items():
        path = field_path(field_path(where, "links"), link)
        _choice(link, path, LINKS, what="link class")
        links[link] = _fit(fit, path)
    require(bool(links), field_path(where, "links"), "must hold at least one link class (intra, inter)")
    collectives: dict[str, dict[str, dict[int, Fit]]] = {}
    for kind, by_link in _object(terms["collectives"], field_path(where, "collectives")).items():
        kind_path = field_path(field_path(where, "collectives"), kind)
        _choice(kind, kind_path, COLLECTIVES, what="collective")
        for link, sizes in _object(by_link, kind_path).items():
            link_path = field_path(kind_path, link)
            _choice(link, link_path, LINKS, what="link class")
            for size, fit in _object(sizes, link_path).items():
                size_path = field_path(link_path, size)
                require(re.fullmatch(r"[1-9][0-9]{0,4}", size) is not None and int(size) >= 2, size_path,
                        "a group size must be an integer of at least 2, written without sign or leading zeros")
                collectives.setdefault(kind, {}).setdefault(link, {})[int(size)] = _fit(fit, size_path)
    overheads_path = field_path(where, "overheads")
    raw = json_object(terms["overheads"], overheads_path, ("per_op_s", "per_step_s", "per_transfer_s"),
                      OPTIONAL_OVERHEADS)
    overlap = raw.get("compute_overlap")
    if overlap is not None:
        where = field_path(overheads_path, "compute_overlap")
        require(_is_number(overlap) and 0 <= overlap <= 1, where,
                f"must be a number from 0 to 1, got {describe(overlap)}")
    delay = raw.get("busy_send_s")  # 0 when a computing sender kept nothing waiting
    overheads = Overheads(**{key: _seconds(raw[key], field_path(overheads_path, key)) for key in raw
                             if key not in ("compute_overlap", "busy_send_s")},
                          compute_overlap=None if overlap is None else float(overlap),
                          busy_send_s=None if delay is None else _bounded_seconds(delay, field_path(overheads_path,
                                                                                                   "busy_send_s")))
    return links, collectives, overheads


def _fit(value: Any, where: str) -> Fit:
    obj = json_object(value, where, _FIT_KEYS)
    return Fit(latency_s=_seconds(obj["latency_s"], f"{where}.latency_s"),
               gbps=bounded_number(obj["gbps"], f"{where}.gbps", "gbps"),
               residual_rms_s=_non_negative(obj["residual_rms_s"], f"{where}.residual_rms_s"),
               residual_max_rel=_non_negative(obj["residual_max_rel"], f"{where}.residual_max_rel"),
               samples=_count(obj["samples"], f"{where}.samples", low=1, high=INT32_MAX))


def _samples(value: Any, where: str) -> tuple[Sample, ...]:
    require(isinstance(value, list), where, f"must be a list, got {describe(value)}")
    samples = []
    for i, raw in enumerate(value):
        path = f"{where}[{i}]"
        obj = json_object(raw, path, ("kind", "link", "group_size", "bytes", "run", "seconds"))
        kind = _choice(obj["kind"], f"{path}.kind", KINDS, what="kind")
        link = obj["link"]
        if link is not None:
            _choice(link, f"{path}.link", LINKS, what="link class")
        size, nbytes = obj["group_size"], obj["bytes"]
        samples.append(Sample(kind=kind, link=link,
                              group_size=None if size is None else _count(size, f"{path}.group_size", 1, INT32_MAX),
                              bytes=None if nbytes is None else _count(nbytes, f"{path}.bytes", 1, INT64_MAX),
                              run=_count(obj["run"], f"{path}.run", 0, INT32_MAX),
                              seconds=_seconds(obj["seconds"], f"{path}.seconds")))
    return tuple(samples)


# ---------------------------------------------------------------- field checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _object(value: Any, where: str) -> dict:
    require(isinstance(value, dict), where, f"must be a JSON object, got {describe(value)}")
    return value


def _string(value: Any, where: str, empty: bool = True) -> str:
    require(isinstance(value, str), where, f"must be a string, got {describe(value)}")
    require(empty or value.strip() != "", where, "must not be empty")
    return value


def _hash(value: Any, where: str) -> str:
    require(isinstance(value, str) and _HASH.match(value) is not None, where,
            f"must be 16 lowercase hex digits, got {describe(value)}")
    return value


def _choice(value: Any, where: str, allowed: tuple[str, ...], what: str = "value") -> str:
    require(isinstance(value, str) and value in allowed, where,
            f"unknown {what} {describe(value)} (allowed: {', '.join(allowed)})")
    return value


def _seconds(value: Any, where: str) -> float:
    require(_is_number(value) and value > 0, where,
            f"must be a positive finite number of seconds, got {describe(value)}")
    require(value <= MAX_SECONDS, where, f"must be at most {MAX_SECONDS:g} s, got {value:g}")
    return float(value)


def _bounded_seconds(value: Any, where: str) -> float:
    """Seconds that may be 0."""
    value = _non_negative(value, where)
    require(value <= MAX_SECONDS, where, f"must be at most {MAX_SECONDS:g} s, got {value:g}")
    return value


def _non_negative(value: Any, where: str) -> float:
    require(_is_number(value) and value >= 0, where, f"must be a finite number >= 0, got {describe(value)}")
    return float(value)


def _count(value: Any, where: str, low: int, high: int) -> int:
    require(_is_int(value) and low <= value <= high, where,
            f"must be an integer in [{low}, {high}], got {describe(value)}")
    return int(value)
