"""A plan against its baselines and the ideal bound, as rows and as a markdown table."""

from __future__ import annotations

BASELINE_LABELS = {"dp_nccl": "DP-NCCL", "dp_nccl_p": "DP-NCCL-P", "horovod": "Horovod", "mcmc": "MCMC"}


def comparison_rows(plan_json: dict) -> list[tuple[str, float, bool, float]]:
    """(label, iteration time s, out of memory, TAG's speedup over it) for TAG, each baseline and the ideal."""
    tag = plan_json["tag"]["iteration_time_s"]
    rows = [("TAG", tag, bool(plan_json["oom"]), 1.0)]
    for key, label in BASELINE_LABELS.items():
        entry = plan_json["baselines"][key]
        rows.append((label, entry["iteration_time_s"], bool(entry.get("oom")), entry["iteration_time_s"] / tag))
    rows.append(("ideal (lower bound)", plan_json["ideal_time_s"], False, plan_json["ideal_time_s"] / tag))
    return rows


def markdown_table(plan_json: dict) -> str:
    lines = ["| plan | iteration ms | TAG speedup |", "|---|---:|---:|"]
    for label, t, oom, speedup in comparison_rows(plan_json):
        lines.append(f"| {label} | {t * 1e3:.2f}{' (OOM)' if oom else ''} | {speedup:.2f}x |")
    if plan_json.get("one_device"):
        lines.append(f"\nThe plan is `single`: {plan_json['one_device']['why']}.")
    return "\n".join(lines)
