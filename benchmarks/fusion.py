"""Fusion benchmark: a training step here under no XLA, TF auto-clustering, whole-step jit and TAG's plan.

    python benchmarks/fusion.py [--models transformer,bert_base,...] [--repeats 3] [--steps 5] [--markdown]

For each model: capture the step, plan fusion (`tag_core.fusion.patterns.plan_fusion`), tune the plan per pattern
(`tag_core.fusion.tune.tune_plan`: each pattern timed here as TF ops and as one XLA cluster, kept only when
the cluster wins), then time the step in the four modes of `tag fuse --measure`, each in its own process.
Each mode runs `--repeats` times (modes interleaved, so load from other work on the machine hits every mode
alike); a run times `--steps` steps after `--warmup` and its median is one sample. The table reports the
median over runs, kernels per step from TF's step stats, the first step (XLA compilation included) and the
peak RSS of each mode's process. `--untuned` also times the plan before tuning (mode `tag_untuned`).

Raw figures go to benchmarks/fusion.json; with --markdown the "Fusion" section of benchmarks/results.md is
rewritten (only that section). The machine's load average is recorded before and after each model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results_md import write_section  # noqa: E402  (benchmarks/ is the script's folder)

from tag_core.capture import capture, resolve_model, save_step  # noqa: E402
from tag_core.fusion import check_step, plan_fusion, step_fetches, tune_plan  # noqa: E402
from tag_core.fusion.measure import FUSIBLE_ONLY_FLAGS, MODES, measure_modes, measure_paired  # noqa: E402
from tag_core.fusion.step_check import STEP_MARGIN  # noqa: E402
from tag_core.fusion.tune import step_values  # noqa: E402

# Reduced for a 2-core CPU; the widths are the published ones unless the name says otherwise.
# model: (spec, batch, timed steps per run, paired rounds)
MODELS = {
    # layers=1: one encoder and one decoder block (two layers), d_model 512, 8 heads, ff 2048, vocab 32000.
    "transformer": ("transformer[layers=1]", 16, 5, 20),
    # Two of BERT-base's twelve encoder layers, hidden 768, sequence 64 instead of 128.
    "bert_base": ("bert_base[layers=2,seq_len=64]", 8, 5, 20),
    "mobilenet_v2": ("mobilenet_v2[image_size=96]", 16, 10, 16),
    "small_cnn": ("small_cnn", 16, 200, 200),
}
XLA_MODES = ("autocluster", "jit")
# `function`: jit's harness (a tf.function step) without XLA. The session modes (tf, autocluster, tag) share one
# harness, jit another; jit / function is XLA's own effect in its harness, comparable with tag / tf.
PAIRED_MODES = (*MODES, "function")
SECTION = "## Fusion (`benchmarks/fusion.py`)"
OUT = ROOT / "benchmarks" / "fusion.json"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure(key: str, repeats: int, steps: int | None, warmup: int, untuned: bool, rounds: int | None) -> dict:
    name, batch, default_steps, default_rounds = MODELS[key]
    steps, rounds = steps or default_steps, rounds or default_rounds
    spec = resolve_model(name, batch)
    row: dict = {"model": key, "spec": spec.name, "batch_size": batch, "steps": steps, "load_before": load()}
    start = time.perf_counter()
    captured = capture(spec)
    graph, step = captured.graph, captured.step
    row["capture_s"] = round(time.perf_counter() - start, 1)
    with tempfile.TemporaryDirectory() as folder:
        _, meta = save_step(step, Path(folder))
        planned = plan_fusion(graph, step.graph_def)
        row["planned"] = {"patterns": len(planned.patterns), "ops_fused": planned.ops_fused,
                          "kernels_before": planned.kernels_before, "kernels_after": planned.kernels_after}
        start = time.perf_counter()
        tuned = tune_plan(planned, step.graph_def, step_fetches(step), values=lambda names: step_values(step, spec, names))
        row["tune_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        tuned = check_step(tuned, step, spec)
        row["step_check_s"] = round(time.perf_counter() - start, 1)
        del captured, step
        plans = {"tag": tuned, **({"tag_untuned": planned} if untuned else {})}
        files = {}
        for mode, plan in plans.items():
            files[mode] = Path(folder) / f"{mode}.json"
            files[mode].write_text(json.dumps(plan.to_json()))
        row["plan"] = {mode: {"patterns": len(p.patterns), "ops_fused": p.ops_fused, "kernels_before": p.kernels_before,
                              "kernels_after": p.kernels_after, "regions": len(p.regions)}
                       for mode, p in plans.items()}
        row["tuning"] = {k: v for k, v in tuned.measured.items()
                         if k.startswith(("tuned_", "library_calls_")) or k == "step_check"}
        modes = [*MODES, *(["tag_untuned"] if untuned else [])]
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for r in range(repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate: no mode always first
                plan_file = str(files.get(mode, files["tag"]))
                child = "tag" if mode == "tag_untuned" else mode
                result = measure_modes(spec.name, batch, str(meta), plan_file, steps=steps, warmup=warmup,
                                       modes=(child,))[child]
                runs[mode].append(result)
                print(f"  {key} run {r + 1}/{repeats} {mode}: {result['step_ms']:.1f} ms", file=sys.stderr, flush=True)
        row["paired"] = measure_paired(spec.name, batch, str(meta), str(files["tag"]), rounds=rounds, warmup=warmup,
                                       modes=PAIRED_MODES)
        print(f"  {key} paired: {row['paired']['ratio_to_tf']}", file=sys.stderr, flush=True)
        # Where XLA's gain comes from: auto-clustering confined to the op classes TAG may fuse.
        row["paired_fusible_only"] = measure_paired(spec.name, batch, str(meta), str(files["tag"]), rounds=rounds,
                                                    warmup=warmup, modes=("tf", "autocluster"),
                                                    flags=FUSIBLE_ONLY_FLAGS)
        print(f"  {key} paired, fusible ops only: {row['paired_fusible_only']['ratio_to_tf']}", file=sys.stderr,
              flush=True)
    row["modes"] = {mode: summarise(results) for mode, results in runs.items()}
    row["load_after"] = load()
    row.update(ratios(row["modes"], row["paired"]))
    return row


def summarise(results: list[dict]) -> dict:
    medians = [r["step_ms"] for r in results]
    kernels = [r["kernels"] for r in results if r["kernels"] is not None]
    return {
        "step_ms": round(statistics.median(medians), 2),
        "step_ms_runs": [round(m, 2) for m in medians],
        "first_step_ms": round(statistics.median(r["first_step_ms"] for r in results), 1),
        "kernels": kernels[0] if kernels else None,
        "peak_rss_mb": round(max(r["peak_rss_mb"] or 0 for r in results), 1),
    }


def ratios(modes: dict, paired: dict) -> dict:
    tag = modes["tag"]["step_ms"]
    best = min(XLA_MODES, key=lambda m: modes[m]["step_ms"])
    r = paired["ratio_to_tf"]
    paired_best = min(XLA_MODES, key=lambda m: r[m])
    # Each XLA mode against the no-XLA step of its own harness.
    own = {"autocluster": r["autocluster"], "jit": round(r["jit"] / r["function"], 4) if "function" in r else r["jit"]}
    own_best = min(own, key=own.get)
    return {"best_xla_mode": best, "tag_over_best_xla": round(tag / modes[best]["step_ms"], 3),
            "tag_over_tf": round(tag / modes["tf"]["step_ms"], 3),
            "paired_best_xla_mode": paired_best, "paired_tag_over_best_xla": round(r["tag"] / r[paired_best], 3),
            "paired_tag_over_tf": r["tag"], "xla_over_own_harness": own, "own_harness_best_xla_mode": own_best,
            "own_harness_tag_over_best_xla": round(r["tag"] / own[own_best], 3)}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [SECTION, "",
             f"A training step on this machine's CPU ({meta['cpus']} cores, {meta['machine']}; TF "
             f"{meta['tensorflow']}) in four modes: `tf` no XLA; `autocluster` "
             f"`TF_XLA_FLAGS=\"--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit\"`; `jit` the whole step under "
             f"`tf.function(jit_compile=True)`; `tag` TAG's fusion plan after tuning (per pattern and per library "
             f"call, then the step check): each kept pattern one XLA cluster, or, when the step check found it "
             f"fastest, compiled regions (tag_core/fusion/regions.py: whole connected parts of the step, each run as "
             f"one must-compile function call, tag_core/fusion/region_calls.py: one XLA program with compute ops as library "
             f"calls and variables updated in place, as jit's own call). Step ms: median over {meta['repeats']} runs per mode, "
             f"each run its own process timing the model's steps after {meta['warmup']} warm-up steps, modes "
             f"interleaved. Paired: the four modes in one process, a step of each in turn, median over rounds of "
             f"(mode's step / the `tf` step of the same round); load from other work on the machine moves these "
             f"ratios far less than the per-process medians. `jit` runs in a harness of its own (a `tf.function` "
             f"step, no session), so the paired run also times that harness without XLA (`function`): jit / "
             f"function is XLA's effect there, comparable with tag / tf and autocluster / tf in the session "
             f"harness; the goal verdicts use those. `autocluster, fusible ops only`: auto-clustering with "
             f"`--tf_xla_ops_to_cluster=FUSIBLE` too (XLA's elementwise, reduction and layout ops; no MatMul or "
             f"Conv), paired with `tf` in a process of its own: XLA confined to the op classes TAG may fuse. Ratios are step-time ratios (below 1: TAG's plan is "
             f"faster). Kernels per step from TF's step stats (an XLA cluster counts once; `jit` lists none). "
             f"Load: 1-minute load average before / after the model; other agents' work shared the 2 cores. "
             f"Reproduce: `python benchmarks/fusion.py --markdown` (`--report` rewrites this from fusion.json).", "",
             "| model | batch | tf ms | autocluster ms | jit ms | tag ms | tag / best XLA | tag / tf | "
             "paired tag / best XLA, each in its harness | paired tag / tf | kernels tf → tag (autocluster) | "
             "patterns planned → tuned → kept (regions) | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        m = row["modes"]
        tuning = row["tuning"]
        lines.append(
            f"| `{row['spec']}` | {row['batch_size']} | {m['tf']['step_ms']:.1f} | {m['autocluster']['step_ms']:.1f} | "
            f"{m['jit']['step_ms']:.1f} | **{m['tag']['step_ms']:.1f}** | {row['tag_over_best_xla']:.2f} "
            f"({row['best_xla_mode']}) | {row['tag_over_tf']:.2f} | **{_own(row, 'tag_over_best_xla'):.3f}** "
            f"({_own(row, 'best_xla_mode')}) | **{row['paired_tag_over_tf']:.3f}** | {m['tf']['kernels']} → "
            f"{m['tag']['kernels']} ({m['autocluster']['kernels']}) | {row['planned']['patterns']} → "
            f"{tuning.get('tuned_patterns_kept', 0)} → {row['plan']['tag']['patterns']} "
            f"({row['plan']['tag'].get('regions', 0)}) | "
            f"{row['load_before'][0]:.1f} / {row['load_after'][0]:.1f} |")
    lines += ["", "Paired step ratios to `tf` per mode, first step (XLA compilation included, ms) and peak RSS of each "
              "mode's process (MB):", "",
              "| model | paired autocluster | paired autocluster, fusible ops only | paired jit | paired function | "
              "jit / function | paired tag | first tf | first autocluster | first jit | first tag | RSS tf | "
              "RSS autocluster | RSS jit | RSS tag |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        m, r = row["modes"], row["paired"]["ratio_to_tf"]
        function = f"{r['function']:.3f}" if "function" in r else "–"
        lines.append(f"| {row['model']} | {r['autocluster']:.3f} | {_fusible_only(row)} | {r['jit']:.3f} | "
                     f"{function} | {row.get('xla_over_own_harness', {}).get('jit', r['jit']):.3f} | {r['tag']:.3f} | " +
                     " | ".join(f"{m[k]['first_step_ms']:.0f}" for k in MODES) + " | " +
                     " | ".join(f"{m[k]['peak_rss_mb']:.0f}" for k in MODES) + " |")
    if any("tag_untuned" in row["modes"] for row in rows):
        lines += ["", "The plan before tuning (every planned pattern an XLA cluster), median step ms:", ""]
        for row in rows:
            if "tag_untuned" in row["modes"]:
                u = row["modes"]["tag_untuned"]
                lines.append(f"- {row['model']}: {u['step_ms']:.1f} ms ({u['kernels']} kernels; "
                             f"{u['step_ms'] / row['modes']['tf']['step_ms']:.2f} × tf)")
    lines += ["", *findings(rows), ""]
    return "\n".join(lines)


def _own(row: dict, key: str):
    """The own-harness figure when the row has one (rows measured before `function` existed do not)."""
    return row.get(f"own_harness_{key}", row[f"paired_{key}"])


def _fusible_only(row: dict) -> str:
    ratio = row.get("paired_fusible_only", {}).get("ratio_to_tf", {}).get("autocluster")
    return "–" if ratio is None else f"{ratio:.3f}"


def findings(rows: list[dict]) -> list[str]:
    out = ["Goals, on the paired ratios (per-process medians move with the load):"]
    for row in rows:
        if row["model"] in ("transformer", "bert_base"):
            ratio = _own(row, "tag_over_best_xla")
            verdict = "met" if ratio <= 1 else "a tie within the noise" if ratio <= 1 + STEP_MARGIN else "not met"
            r = row["paired"]["ratio_to_tf"]
            raw = "" if "function" not in r else (
                f" Across harnesses, raw paired ratios to the session `tf` step: jit {r['jit']:.3f}, "
                f"function {r['function']:.3f}, tag {r['tag']:.3f}.")
            out.append(f"- TAG's plan at least as fast as the best XLA mode on {row['model']}: {verdict} "
                       f"({ratio:.3f} × {_own(row, 'best_xla_mode')}, each against the no-XLA step of its own "
                       f"harness; {r['tag'] / r['autocluster']:.3f} × autocluster, same harness).{raw} XLA "
                       f"auto-clustering confined to fusible ops (no MatMul): {_fusible_only(row)} × tf.")
    worst = max(rows, key=lambda r: r["paired_tag_over_tf"])
    empty = " with an empty plan, the very graph `tf` runs: that is the noise of the measurement" \
        if not (worst["plan"]["tag"]["patterns"] or worst["plan"]["tag"].get("regions")) else ""
    out.append(f"- Never slower than no XLA: worst paired tag / tf {worst['paired_tag_over_tf']:.3f} "
               f"({worst['model']}{empty}); the step check's margin is {STEP_MARGIN:.0%}, about the noise of these "
               f"ratios here.")
    for row in rows:
        confined = row.get("paired_fusible_only", {}).get("ratio_to_tf", {}).get("autocluster")
        if confined is not None and confined < row["paired_tag_over_tf"] - STEP_MARGIN:
            out.append(f"- XLA's own clustering of the op classes TAG may fuse beats TAG's plan on {row['model']}: "
                       f"{confined:.3f} × tf against {row['paired_tag_over_tf']:.3f}.")
    out += ["", "Per model:"]
    for row in rows:
        m = row["modes"]
        spread = {k: (min(v["step_ms_runs"]), max(v["step_ms_runs"])) for k, v in m.items()}
        check = row["tuning"].get("step_check", {})
        variants = ", ".join(
            f"{v['patterns']} patterns" + (f" in {v['regions']} region(s)" if v.get("regions") else "") +
            (f" {v['ratio']:.3f}" if "ratio" in v else " failed to compile") for v in check.get("variants", []))
        out.append(f"- {row['model']}: run medians tf {spread['tf'][0]:.1f}–{spread['tf'][1]:.1f} ms, "
                   f"tag {spread['tag'][0]:.1f}–{spread['tag'][1]:.1f} ms. Per-pattern tuning kept "
                   f"{row['tuning'].get('tuned_patterns_kept', 0)} of {row['planned']['patterns']} patterns "
                   f"({row['tune_s']:.0f} s); the step check (paired ratios to the plain step over "
                   f"at least {check.get('rounds', 0)} rounds each: {variants or 'nothing to check'}) kept "
                   f"{row['plan']['tag']['patterns']} ({row['plan']['tag']['ops_fused']} ops"
                   f"{', in ' + str(row['plan']['tag']['regions']) + ' region(s)' if row['plan']['tag'].get('regions') else ''}), "
                   f"{row.get('step_check_s', 0):.0f} s; {row['steps']} timed steps per run, "
                   f"{row['paired']['rounds']} paired rounds.")
    return out


def main() -> int:
    import tensorflow as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, help="timed steps per run (default: per model)")
    parser.add_argument("--rounds", type=int, help="rounds of the paired measurement (default: per model)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--untuned", action="store_true", help="also time the plan before tuning")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown from fusion.json")
    args = parser.parse_args()
    meta = {"cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "tensorflow": tf.__version__, "repeats": args.repeats, "steps": args.steps, "warmup": args.warmup}
    if args.report:
        data = json.loads(OUT.read_text())
        write_section(SECTION, markdown(data["rows"], data["meta"]))
        return 0
    previous = {r["model"]: r for r in json.loads(OUT.read_text())["rows"]} if OUT.exists() else {}
    for key in [m for m in args.models.split(",") if m in MODELS]:
        row = measure(key, args.repeats, args.steps, args.warmup, args.untuned, args.rounds)
        previous[key] = row
        print(json.dumps(row), flush=True)
        rows = [previous[k] for k in MODELS if k in previous]
        OUT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.markdown:
        write_section(SECTION, markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
