"""Segment sums as gathers: an embedding table's Adam update compiled as one region, with and without the rewrite.

    python benchmarks/segment_sums.py [--rows 30522] [--width 768] [--ids 512] [--rounds 30] [--markdown]

The update Keras' Adam runs for a sparse gradient (`m += (sum(g) - m)(1 - b1)`, `v += (sum(g²) - v)(1 - b2)`,
`p -= lr m / (√v + ε)`, each sum an `UnsortedSegmentSum` of the gradient's rows into all of the table's rows) is
built as a graph, taken as one compiled region (`fusion_regions.compiled_regions`) and made one must-compile call
twice: as it is (`region_calls.compile_as_calls`), and with its sums rewritten as gathers first
(`fusion.mark_for_xla`, `segment_sums.rewrite_as_gathers`). The two sessions start from the same values and run in
turn, a step of each, `--rounds` times; the table reports the median of each, their ratio, whether the tables
end equal to the bit, and the peak RSS. The defaults are BERT's token embedding (30522 × 768) and a batch of 8
sequences of 64 tokens.

Raw figures go to benchmarks/segment_sums.json; with --markdown the section of benchmarks/results.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results_md import write_section  # noqa: E402  (benchmarks/ is the script's folder)

from tag_core.fusion import FusionPlan, compile_as_calls, compiled_regions, mark_for_xla  # noqa: E402
from tag_core.fusion.measure import GAP_S, peak_rss_mb  # noqa: E402

SECTION = "## Segment sums as gathers (`benchmarks/segment_sums.py`)"
OUT = ROOT / "benchmarks" / "segment_sums.json"
UPDATES = ["update_m", "update_v", "update_p"]


def adam_update(rows: int, width: int, ids: int):
    """The graph of one sparse Adam update of a rows × width table from `ids` gradient rows."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        gradient = tf.compat.v1.placeholder(tf.float32, [ids, width], name="gradient")
        indices = tf.compat.v1.placeholder(tf.int32, [ids], name="indices")
        handles = {name: tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[rows, width], shared_name=name, name=name)
                   for name in ("p", "m", "v")}

        def read(name, scope):
            return tf.raw_ops.ReadVariableOp(resource=handles[name], dtype=tf.float32, name=f"{scope}/read_{name}")

        def dense(values, scope):
            return tf.raw_ops.UnsortedSegmentSum(data=values, segment_ids=indices, num_segments=rows, name=f"{scope}/sum")

        first = tf.raw_ops.AssignAddVariableOp(
            resource=handles["m"], value=(dense(gradient, "m") - read("m", "m")) * 0.1, name="update_m")
        with tf.control_dependencies([first]):
            second = tf.raw_ops.AssignAddVariableOp(
                resource=handles["v"], value=(dense(tf.square(gradient), "v") - read("v", "v")) * 0.001,
                name="update_v")
        with tf.control_dependencies([second]):
            step = read("m", "p") * 0.01 / (tf.sqrt(read("v", "p")) + 1e-7)
            tf.raw_ops.AssignSubVariableOp(resource=handles["p"], value=step, name="update_p")
        for name, handle in handles.items():
            value = tf.compat.v1.placeholder(tf.float32, [rows, width], name=f"init_{name}")
            tf.raw_ops.AssignVariableOp(resource=handle, value=value, name=f"assign_{name}")
        tf.raw_ops.ReadVariableOp(resource=handles["p"], dtype=tf.float32, name="table")
    return graph.as_graph_def()


def _session(graph_def, values: dict):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    session = tf.compat.v1.Session(graph=graph)
    for name, value in values.items():
        session.run(f"assign_{name}", {f"init_{name}:0": value})
    return session


def measure(rows: int, width: int, ids: int, rounds: int) -> dict:
    import tensorflow as tf

    graph_def = adam_update(rows, width, ids)
    (region,) = compiled_regions(graph_def, set(), UPDATES)
    as_is, rewritten = tf.compat.v1.GraphDef(), tf.compat.v1.GraphDef()
    as_is.CopyFrom(graph_def)
    rewritten.CopyFrom(graph_def)
    compile_as_calls(as_is, [region], UPDATES)
    marked = mark_for_xla(rewritten, FusionPlan("adam", [], 0, 0, 0.0, "", regions=[region]), UPDATES)
    rng = np.random.default_rng(0)
    values = {"p": rng.standard_normal([rows, width], dtype=np.float32),
              "m": np.zeros([rows, width], np.float32), "v": np.zeros([rows, width], np.float32)}
    feed = {"gradient:0": rng.standard_normal([ids, width], dtype=np.float32),
            "indices:0": rng.integers(0, rows, ids).astype(np.int32)}
    sessions = {"as_is": _session(as_is, values), "gathers": _session(rewritten, values)}
    for session in sessions.values():  # compile, and warm up
        for _ in range(2):
            session.run(UPDATES, feed)
    times: dict[str, list[float]] = {mode: [] for mode in sessions}
    for k in range(rounds):
        for mode in (list(sessions) if k % 2 == 0 else list(sessions)[::-1]):
            time.sleep(GAP_S)
            start = time.perf_counter()
            sessions[mode].run(UPDATES, feed)
            times[mode].append(time.perf_counter() - start)
    tables = [session.run("table:0") for session in sessions.values()]
    ms = {mode: round(statistics.median(t) * 1e3, 3) for mode, t in times.items()}
    return {"rows": rows, "width": width, "ids": ids, "rounds": rounds, "step_ms": ms,
            "ratio": round(statistics.median(np.array(times["gathers"]) / np.array(times["as_is"])), 4),
            "segment_sums_as_gathers": marked["segment_sums_as_gathers"],
            "tables_equal": bool(np.array_equal(*tables)), "peak_rss_mb": round(peak_rss_mb() or 0.0, 1)}


def markdown(result: dict) -> str:
    return "\n".join([
        SECTION, "",
        f"Keras' sparse Adam update of a {result['rows']} × {result['width']} table from {result['ids']} gradient "
        f"rows, compiled by XLA (CPU) as one region call; {result['rounds']} paired rounds, medians.", "",
        "| region | step (ms) |", "|---|---:|",
        f"| as traced (two dense sums: scatters) | {result['step_ms']['as_is']} |",
        f"| sums as gathers ({result['segment_sums_as_gathers']} rewritten) | {result['step_ms']['gathers']} |", "",
        f"Paired ratio gathers / as traced: **{result['ratio']}**; tables equal to the bit after all steps: "
        f"{result['tables_equal']}; peak RSS {result['peak_rss_mb']} MB.", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=30522)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--ids", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    result = measure(args.rows, args.width, args.ids, args.rounds)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    if args.markdown:
        write_section(SECTION, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
