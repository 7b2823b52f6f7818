"""`tag fidelity`'s report: each strategy's prediction against its measurement, Spearman's rank correlation,
the median |error| and TAG against the fastest alternative; as a dict (--json) or text."""

from __future__ import annotations


def summarise(rows: list[dict], model: str, topology: str, batch: int, calibration: str | None, steps: int,
              warmup: int) -> dict:
    """The report: rows with their errors, Spearman's rank correlation, median |error|, TAG against the best."""
    # Here, not at the top: tag_core.plan loads the planner and numba.
    from tag_core.plan.measured_error import median_abs_error, relative_error

    from .measure import SPREAD, spearman, tag_against_best

    done = [r for r in rows if r["measured_s"] is not None and r["predicted_s"] is not None]
    for r in done:
        r["relative_error"] = relative_error(r["predicted_s"], r["measured_s"])
    return {"model": model, "topology": topology, "batch_size": batch, "calibration": calibration,
            "steps": steps, "warmup": warmup, "spread": SPREAD, "rows": rows,
            "spearman": spearman([r["predicted_s"] for r in done], [r["measured_s"] for r in done]),
            "median_abs_error": median_abs_error([(r["predicted_s"], r["measured_s"]) for r in done]),
            "tag_against_best": tag_against_best(done)}


def format_report(report: dict) -> str:
    calibration = report["calibration"] or "none (the cost model's defaults)"
    lines = [f"{report['model']} on {report['topology']}, batch {report['batch_size']}: median of {report['steps']} "
             f"timed steps after {report['warmup']} warm-up, interleaved over {report['rounds']} rounds; spread = {report['spread']}; calibration {calibration}",
             f"{'strategy':<16} {'predicted ms':>13} {'measured ms':>12} {'spread ms':>10} {'error':>8}"]
    for r in report["rows"]:
        if r["measured_s"] is None:
            predicted = "-" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e3:.2f}"
            lines.append(f"{r['strategy']:<16} {predicted:>13} {'FAILED':>12}  {r.get('error', '').splitlines()[0]}")
            continue
        partly = f"  ({r['steps']} of {report['steps']} steps)" if r.get("stopped") else ""
        lines.append(f"{r['strategy']:<16} {r['predicted_s'] * 1e3:13.2f} {r['measured_s'] * 1e3:12.2f} "
                     f"{r['spread_s'] * 1e3:10.2f} {r['relative_error']:+8.1%}{partly}")
    rho, error = report["spearman"], report["median_abs_error"]
    lines.append(f"Spearman rank correlation, predicted against measured: "
                 f"{'undefined' if rho is None else f'{rho:.2f}'}")
    lines.append(f"median |error|: {'-' if error is None else f'{error:.1%}'}")
    if report.get("position_bias"):
        lines.append("a step over its strategy's median, by place in the round (rotated each round): " + ", ".join(
            f"{b['position'] + 1}: {b['ratio']:.3f}" for b in report["position_bias"]))
    if report.get("drift"):
        lines.append(report["drift"]["text"])
    verdict = report["tag_against_best"]
    if verdict:
        lines.append(verdict["text"])
    return "\n".join(lines)


def all_measured(report: dict) -> bool:
    """Whether every strategy was measured for all its steps (`tag fidelity` exits 0 only then)."""
    return all(r["measured_s"] is not None and not r.get("stopped") for r in report["rows"])
