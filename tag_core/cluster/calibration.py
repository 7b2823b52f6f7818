"""A calibration of a cluster's runtime: what was measured on it, and the cost terms fitted to that.

The contract between `tag calibrate` (which measures, tag_core.runtime.calibrate) and whatever applies
the terms (the cost model). No TensorFlow here.

- A `Sample` is one timed run: a transfer between two devices ("p2p"), a collective over a group
  ("allreduce", "ps" push/pull, "broadcast"), a cheap op of a chain ("op"), an empty-ish step
  ("step"), or a tiny cross-task send/recv pair ("sendrecv"). `link` is "intra" (devices of one
  machine), "inter" (across machines), "client" (a tensor the client feeds to task 0: "p2p" of group
  size 1) or None; `seconds` is the cost of one of them.
- A `Fit` is latency + bytes / bandwidth, least squares over the per-size medians of one
  (kind, link, group size), with its residuals.
- A `Calibration` holds a fit per link class (point-to-point), per collective kind, link and group
  size, the executor's fixed overheads, the samples, and what it was measured for (the topology
  snapshot's hash, the host, the code version). Its hash covers the terms and the topology hash.
- Overlap samples time a compute chain on every task, a chain of transfers between them, and both in
  one step: how much of the transfers the tasks' compute hides (`Overheads.compute_overlap`). GPUs move
  data beside their kernels; a task that is one CPU core does its sends and receives on that core.
- Gap samples time many independent tiny transfers over one link in one step: what each adds when their
  latencies overlap (`Overheads.transfer_gap_s`), against a chained one's whole latency ("sendrecv").
- Send samples time a tiny tensor that one task sends another at the start of a step, on which the
  receiver's compute chain waits, with the sender idle ("send_idle") and computing a chain of its own
  ("send_busy"): how long a sender that computes keeps a transfer waiting (`Overheads.busy_send_s`). A
  task's server threads share its one core with its compute, and wait for the scheduler to let them run.

JSON files: tag_core.cluster.calibration_json. DuckDB rows: `to_record` / `from_record` here, the
SQL in tag_core.store.measurements.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from statistics import median

OVERLAP_KINDS = ("overlap_compute", "overlap_comm", "overlap_both")  # compute, transfers, both at once
SEND_KINDS = ("send_idle", "send_busy")  # a tiny tensor sent at the start, the sender idle or computing
KINDS = ("p2p", "allreduce", "ps", "broadcast", "op", "step", "sendrecv", "gap", *OVERLAP_KINDS, *SEND_KINDS)
COLLECTIVES = ("allreduce", "ps", "broadcast")
LINKS = ("intra", "inter", "client")  # client: the process that feeds task 0 each step
SOURCES = ("local", "cluster", "import")
BITS_PER_BYTE = 8
MIN_LATENCY_S = 1e-6  # a latency too small to measure (fits must keep a positive one)


class FitRefused(ValueError):
    """Samples that cannot determine a fit (one line: which samples, and why)."""


@dataclass(frozen=True)
class Sample:
    kind: str  # one of KINDS
    link: str | None  # "intra", "inter" or None (op, step)
    group_size: int | None  # devices taking part (2 for p2p and sendrecv, tasks for step), None for op
    bytes: int | None  # payload per device; None where there is none (op, step)
    run: int  # repeat number, from 0
    seconds: float  # the cost of one transfer / collective / op / step in this run

    def key(self) -> tuple[str, str | None, int | None]:
        return self.kind, self.link, self.group_size


@dataclass(frozen=True)
class Fit:
    """seconds(bytes) = latency_s + bytes * 8 / (gbps * 1e9)."""

    latency_s: float
    gbps: float
    residual_rms_s: float  # RMS of (fit - median) over the sizes
    residual_max_rel: float  # largest |fit - median| / median over the sizes
    samples: int  # samples the fit was made from

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes * BITS_PER_BYTE / (self.gbps * 1e9)

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "gbps": self.gbps, "residual_rms_s": self.residual_rms_s,
                "residual_max_rel": self.residual_max_rel, "samples": self.samples}


OPTIONAL_OVERHEADS = ("compute_overlap", "transfer_gap_s", "busy_send_s")  # terms a calibration may lack


@dataclass(frozen=True)
class Overheads:
    per_op_s: float  # the executor's cost of dispatching one cheap op
    per_step_s: float  # launching a step that touches every task (session.run of almost nothing)
    per_transfer_s: float  # one tiny cross-task send/recv pair
    # Of moving a transfer's bytes or of a collective, the share the tasks' compute hides (1: all of it, 0:
    # none: the endpoints do it on their cores). None: not measured, which applies as 1 (uncalibrated).
    compute_overlap: float | None = None
    # What one more independent transfer adds on a link (None: not measured: a transfer holds its link for
    # all of its time, latency included).
    transfer_gap_s: float | None = None
    # How long a task that has just begun a step's compute keeps a tensor it sends waiting (None: not measured).
    busy_send_s: float | None = None

    def to_dict(self) -> dict:
        terms = {"per_op_s": self.per_op_s, "per_step_s": self.per_step_s, "per_transfer_s": self.per_transfer_s}
        for key in OPTIONAL_OVERHEADS:  # absent from calibrations made before they were measured
            if getattr(self, key) is not None:
                terms[key] = getattr(self, key)
        return terms


@dataclass(frozen=True)
class Calibration:
    topology: str  # the topology's name
    topology_hash: str  # Topology.content_hash() of the snapshot it was measured for
    source: str  # one of SOURCES: how it came to this store
    host: str  # where it was measured
    code_version: str  # of the code that measured it
    links: dict[str, Fit]  # link class -> point-to-point fit
    collectives: dict[str, dict[str, dict[int, Fit]]]  # kind -> link class -> group size -> fit
    overheads: Overheads
    samples: tuple[Sample, ...] = field(default=(), repr=False)

    def terms(self) -> dict:
        """The fitted terms as JSON-shaped data (what the hash covers, beside topology_hash)."""
        return {
            "links": {link: fit.to_dict() for link, fit in sorted(self.links.items())},
            "collectives": {kind: {link: {str(size): fit.to_dict() for size, fit in sorted(sizes.items())}
                                   for link, sizes in sorted(by_link.items())}
                            for kind, by_link in sorted(self.collectives.items())},
            "overheads": self.overheads.to_dict(),
        }

    @property
    def calibration_hash(self) -> str:
        return calibration_hash(self.terms(), self.topology_hash)

    def fits(self) -> list[tuple[str, str, int | None, Fit]]:
        """Every fit as (kind, link, group size, fit): point-to-point first, then the collectives."""
        rows: list[tuple[str, str, int | None, Fit]] = [("p2p", link, 1 if link == "client" else 2, fit)
                                                        for link, fit in sorted(self.links.items())]
        for kind in COLLECTIVES:
            for link, sizes in sorted(self.collectives.get(kind, {}).items()):
                rows += [(kind, link, size, fit) for size, fit in sorted(sizes.items())]
        return rows


def calibration_hash(terms: dict, topology_hash: str) -> str:
    """16 hex chars of sha256 over canonical JSON of the terms and the topology snapshot's hash."""
    text = json.dumps({"terms": terms, "topology_hash": topology_hash}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- fitting


def fit_latency_bandwidth(samples: list[Sample], label: str, latency_may_vanish: bool = False) -> Fit:
    """Least squares of latency + bytes / bandwidth over the per-size medians of `samples`.

    Relative residuals are minimised (weights 1 / median²): sizes span four orders of magnitude, and
    plain least squares would let the largest size decide the latency too. `label` names the samples
    in the one-line refusal when they cannot determine a fit (fewer than two sizes, a negative or zero
    latency or bandwidth). With `latency_may_vanish` (a cost whose fixed part is measured elsewhere, as
    the step's launch holds a feed's), a fitted latency at or below zero becomes MIN_LATENCY_S and the
    bandwidth is fitted through the origin."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        if s.bytes is None or s.bytes <= 0 or not math.isfinite(s.seconds):
            raise FitRefused(f"{label}: every sample needs a positive byte count and a finite time")
        by_size[s.bytes].append(s.seconds)
    if len(by_size) < 2:
        raise FitRefused(f"{label}: {len(by_size)} distinct size(s); a latency + bandwidth fit needs at least 2")
    sizes = sorted(by_size)
    medians = [median(by_size[b]) for b in sizes]
    if min(medians) <= 0:
        raise FitRefused(f"{label}: a median time is not positive; the measurement is noise")
    weights = [1.0 / (m * m) for m in medians]
    # Weighted normal equations of t = a + c * bytes.
    sw = sum(weights)
    sx = sum(w * x for w, x in zip(weights, sizes))
    sy = sum(w * y for w, y in zip(weights, medians))
    sxx = sum(w * x * x for w, x in zip(weights, sizes))
    sxy = sum(w * x * y for w, x, y in zip(weights, sizes, medians))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise FitRefused(f"{label}: the sizes do not determine a slope")
    slope = (sw * sxy - sx * sy) / det
    latency = (sy - slope * sx) / sw
    if slope <= 0:
        raise FitRefused(f"{label}: time does not grow with size (slope {slope:.3g} s/byte); no bandwidth to fit")
    if latency <= 0 and latency_may_vanish:
        latency, slope = MIN_LATENCY_S, sxy / sxx
    if latency <= 0:
        raise FitRefused(f"{label}: the fitted latency is {latency:.3g} s, not positive; measure smaller sizes "
                         "or more repeats")
    errors = [latency + slope * x - y for x, y in zip(sizes, medians)]
    return Fit(latency_s=latency, gbps=BITS_PER_BYTE / (slope * 1e9),
               residual_rms_s=math.sqrt(sum(e * e for e in errors) / len(errors)),
               residual_max_rel=max(abs(e) / y for e, y in zip(errors, medians)), samples=len(samples))


def describe_key(kind: str, link: str | None, group_size: int | None) -> str:
    parts = [kind] + ([link] if link else []) + ([f"group of {group_size}"] if group_size else [])
    return " ".join(parts)


def less_launch_jitter(feed: Fit, samples: list[Sample]) -> Fit:
    """The feed's fit less the launch's jitter. A feed is one a step, not chained, so each sample is a fed step
    less the *fastest* of its empty steps: it holds the launch's typical excess over its fastest run, which
    the per-step term already charges (the median launch). That excess is taken from the one-task empty
    steps, the same step as the feed's base; the residuals stay those of the fit before it."""
    launches = [s.seconds for s in samples if s.kind == "step" and s.group_size == 1]
    if len(launches) < 2:
        return feed
    jitter = median(launches) - min(launches)
    return replace(feed, latency_s=max(MIN_LATENCY_S, feed.latency_s - jitter))


def _overhead(samples: list[Sample], kind: str, what: str) -> float:
    chosen = [s for s in samples if s.kind == kind]
    if kind == "step":  # the step that touches the most tasks is the one an emitted graph launches
        widest = max((s.group_size or 0 for s in chosen), default=0)
        chosen = [s for s in chosen if (s.group_size or 0) == widest]
    elif kind == "sendrecv" and any(s.link == "inter" for s in chosen):
        chosen = [s for s in chosen if s.link == "inter"]  # what a cross-task pair costs
    if not chosen:
        raise FitRefused(f"{kind}: no samples; {what} cannot be determined")
    value = median(s.seconds for s in chosen)
    if not (math.isfinite(value) and value > 0):
        raise FitRefused(f"{kind}: the median is {value!r}, not a positive time; {what} cannot be determined")
    return value


def _optional_median(samples: list[Sample], kind: str) -> float | None:
    values = [s.seconds for s in samples if s.kind == kind]
    return float(median(values)) if values else None


def compute_overlap(samples: list[Sample]) -> float | None:
    """The share of the transfers' time that compute hid: (compute + transfers - both) / the shorter of the
    two, from the medians, within [0, 1]. None without overlap samples."""
    medians = [_optional_median(samples, kind) for kind in OVERLAP_KINDS]
    if None in medians:
        return None
    compute, comm, both = medians
    hidden = (compute + comm - both) / min(compute, comm)
    return float(min(1.0, max(0.0, hidden)))


def busy_send_delay(samples: list[Sample]) -> float | None:
    """How much later a tensor reaches a waiting receiver when its sender computes meanwhile: the busy
    sender's step less the later of the idle sender's and the two compute chains' without the tensor (its
    own, "overlap_compute"), from the medians, at least 0. None without send samples."""
    medians = [_optional_median(samples, kind) for kind in (*SEND_KINDS, "overlap_compute")]
    if None in medians:
        return None
    idle, busy, compute = medians
    return float(max(0.0, busy - max(idle, compute)))


def fit_calibration(samples: list[Sample], *, topology: str, topology_hash: str, source: str, host: str,
                    code_version: str) -> Calibration:
    """Every fit and overhead of a calibration from its samples (FitRefused when some cannot be made)."""
    groups: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.key()].append(s)
    links: dict[str, Fit] = {}
    collectives: dict[str, dict[str, dict[int, Fit]]] = {}
    for (kind, link, size), members in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if kind == "p2p" and link == "client":
            try:  # optional: a calibration without it leaves the client's feed uncharged
                fit = fit_latency_bandwidth(members, describe_key(kind, link, None), latency_may_vanish=True)
                links[link] = less_launch_jitter(fit, samples)
            except FitRefused:
                pass
        elif kind == "p2p":
            links[link] = fit_latency_bandwidth(members, describe_key(kind, link, None))
        elif kind in COLLECTIVES:
            fit = fit_latency_bandwidth(members, describe_key(kind, link, size))
            collectives.setdefault(kind, {}).setdefault(link, {})[int(size)] = fit
    if not set(links) - {"client"}:
        raise FitRefused("p2p: no point-to-point samples; a calibration needs at least one link class")
    overheads = Overheads(per_op_s=_overhead(samples, "op", "the per-op cost"),
                          per_step_s=_overhead(samples, "step", "the per-step cost"),
                          per_transfer_s=_overhead(samples, "sendrecv", "the per-transfer cost"),
                          compute_overlap=compute_overlap(samples),
                          transfer_gap_s=_optional_median(samples, "gap"),
                          busy_send_s=busy_send_delay(samples))
    return Calibration(topology=topology, topology_hash=topology_hash, source=source, host=host,
                       code_version=code_version, links=links, collectives=collectives, overheads=overheads,
                       samples=tuple(samples))


# ---------------------------------------------------------------- DuckDB rows


def to_record(calibration: Calibration) -> tuple[dict, list[dict]]:
    """The `calibrations` row (store.CALIBRATION_COLUMNS but created_at) and the sample rows."""
    record = {"calibration_hash": calibration.calibration_hash, "topology": calibration.topology,
              "topology_hash": calibration.topology_hash, "source": calibration.source, "host": calibration.host,
              "code_version": calibration.code_version, "terms": calibration.terms()}
    rows = [{"kind": s.kind, "link": s.link, "group_size": s.group_size, "bytes": s.bytes, "run": s.run,
             "seconds": s.seconds} for s in calibration.samples]
    return record, rows


def from_record(record: dict, sample_rows: list[dict]) -> Calibration:
    """A Calibration from its stored row and sample rows (what went into the store was validated)."""
    links, collectives, overheads = terms_from_dict(record["terms"])
    samples = tuple(Sample(kind=r["kind"], link=_none_if_missing(r["link"]), group_size=_int_or_none(r["group_size"]),
                           bytes=_int_or_none(r["bytes"]), run=int(r["run"]), seconds=float(r["seconds"]))
                    for r in sample_rows)
    return Calibration(topology=record["topology"], topology_hash=record["topology_hash"], source=record["source"],
                       host=record["host"] or "", code_version=record["code_version"] or "", links=links,
                       collectives=collectives, overheads=overheads, samples=samples)


def fit_from_dict(data: dict) -> Fit:
    return Fit(latency_s=float(data["latency_s"]), gbps=float(data["gbps"]),
               residual_rms_s=float(data["residual_rms_s"]), residual_max_rel=float(data["residual_max_rel"]),
               samples=int(data["samples"]))


def terms_from_dict(terms: dict) -> tuple[dict[str, Fit], dict[str, dict[str, dict[int, Fit]]], Overheads]:
    """The inverse of Calibration.terms() (no checks: tag_core.cluster.calibration_json validates files)."""
    links = {link: fit_from_dict(fit) for link, fit in terms["links"].items()}
    collectives = {kind: {link: {int(size): fit_from_dict(fit) for size, fit in sizes.items()}
                          for link, sizes in by_link.items()} for kind, by_link in terms["collectives"].items()}
    return links, collectives, Overheads(**{k: float(v) for k, v in terms["overheads"].items()})


def _none_if_missing(value):
    # DataFrames bring NULL back as None or NaN, depending on the column's type.
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _int_or_none(value) -> int | None:
    value = _none_if_missing(value)
    return None if value is None else int(value)


def save_to_store(conn, calibration: Calibration) -> None:
    """Store the calibration and its samples in one transaction (the same hash again replaces them)."""
    import pandas as pd

    from tag_core import store

    record, rows = to_record(calibration)
    frame = pd.DataFrame(rows, columns=store.SAMPLE_COLUMNS).astype(
        {"group_size": "Int64", "bytes": "Int64", "run": "int64", "seconds": "float64"})
    store.save_calibration(conn, record, frame)


def load_from_store(conn, *, topology: str | None = None, calibration_hash: str | None = None) -> Calibration | None:
    """The calibration with `calibration_hash`, else the newest one of `topology` (of any topology when
    neither is given), or None."""
    from tag_core import store

    if calibration_hash is not None:
        record = store.load_calibration(conn, calibration_hash)
    else:
        record = store.latest_calibration(conn, topology)
    if record is None:
        return None
    rows = store.calibration_samples(conn, record["calibration_hash"]).to_dict("records")
    return from_record(record, rows)
