"""What `tag calibrate` shows of a calibration: its summary (--json), the per-series medians of its samples,
and the table of its fits, overheads and medians."""

from __future__ import annotations

from collections import defaultdict
from statistics import median

from tag_core.cluster.calibration import Calibration

from .calibration_graphs import format_bytes


def summary(calibration: Calibration) -> dict:
    return {"calibration_hash": calibration.calibration_hash, "topology": calibration.topology,
            "topology_hash": calibration.topology_hash, "source": calibration.source, "host": calibration.host,
            "code_version": calibration.code_version, **calibration.terms(), "measured": medians(calibration)}


def medians(calibration: Calibration) -> list[dict]:
    """Per measured series: median and spread (min, max) of its samples."""
    groups = defaultdict(list)
    for s in calibration.samples:
        groups[(s.kind, s.link, s.group_size, s.bytes)].append(s.seconds)
    return [{"kind": kind, "link": link, "group_size": size, "bytes": nbytes, "median_s": median(times),
             "min_s": min(times), "max_s": max(times), "runs": len(times)}
            for (kind, link, size, nbytes), times in groups.items()]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.2f} us"


def _measured_ms(seconds: float | None) -> str:
    return "not measured" if seconds is None else _ms(seconds)


def fit_lines(calibration: Calibration) -> list[str]:
    """The table `tag calibrate` prints: each fit, the overheads, each measured series' median."""
    lines = [f"  {'fit (latency + bytes / bandwidth)':<34} {'latency':>10} {'Gbit/s':>8} {'resid. rms':>11} "
             f"{'max rel':>8} {'samples':>7}"]
    for kind, link, size, fit in calibration.fits():
        label = f"{kind} {link}" + (f" x{size}" if kind != "p2p" else "")
        lines.append(f"  {label:<34} {_ms(fit.latency_s):>10} {fit.gbps:>8.3g} {_ms(fit.residual_rms_s):>11} "
                     f"{fit.residual_max_rel:>8.1%} {fit.samples:>7}")
    o = calibration.overheads
    hidden = "not measured" if o.compute_overlap is None else f"{o.compute_overlap:.0%}"
    lines.append(f"  overheads: per op {_ms(o.per_op_s)}, per step {_ms(o.per_step_s)}, per send/recv pair "
                 f"{_ms(o.per_transfer_s)}; transfers that compute hides: {hidden}; each more independent transfer: "
                 f"{_measured_ms(o.transfer_gap_s)}; a sender that has just begun computing holds a transfer: "
                 f"{_measured_ms(o.busy_send_s)}")
    lines.append(f"  {'measured (per transfer, collective, op or step)':<48} {'median':>10} {'min':>10} "
                 f"{'max':>10} runs")
    for row in medians(calibration):
        label = " ".join(str(x) for x in (row["kind"], row["link"]) if x)
        if row["kind"] in ("allreduce", "ps", "broadcast", "step"):
            label += f" x{row['group_size']}"
        if row["bytes"]:
            label += f" {format_bytes(row['bytes'])}"
        lines.append(f"  {label:<48} {_ms(row['median_s']):>10} {_ms(row['min_s']):>10} {_ms(row['max_s']):>10} "
                     f"{row['runs']:>4}")
    return lines
