"""Sufficient Factor Broadcasting: the MILP against hand-computed costs, the time-limit fallback,
the planner's and the CLI's use of it, and emitted SFB graphs that compute the single-device step."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from simgraphs import topology

from tag_core.capture import Edge, Op, OpGraph, Variable
from tag_core.plan import plan
from tag_core.search import Budget
from tag_core.sfb import apply_sfb, decide, find_subgraphs
from tag_core.simulate import Simulator, Strategy
from tag_core.simulate.cost import allgather_time, hierarchical_allreduce_time

K = M = 512  # x is (batch, K), w is (K, M): dW = xᵀ·dY is K·M floats, the factors K + M per sample
W_BYTES = 4 * K * M
GTX = "GTX1080Ti"
US_PER_SAMPLE = 10.0  # every batch-dependent op, gw included


def dense_graph(batch: int = 8) -> OpGraph:
    """x -> mm = x·w -> loss; backward dY -> gw = xᵀ·dY -> apply (a Dense layer's weight gradient)."""
    row_x, row_y = 4 * K * batch, 4 * M * batch
    ops = [
        Op("x", "Placeholder", row_x, 0, is_input=True, batch_scaled=True),
        Op("read", "ReadVariableOp", W_BYTES, 0, W_BYTES, is_parameter=True, variable="w"),
        Op("mm", "MatMul", row_y, 2 * batch * K * M, batch_scaled=True),
        Op("loss", "Mean", 4, batch * M),
        Op("dy", "Mul", row_y, batch * M, is_gradient=True, batch_scaled=True),
        Op("gw", "MatMul", W_BYTES, 2 * batch * K * M, is_gradient=True),
        Op("apply", "AssignSubVariableOp", 0, K * M, is_apply=True, variable="w"),
    ]
    edges = [Edge(0, 2, row_x, True, "x:0"), Edge(1, 2, W_BYTES, False, "read:0"), Edge(2, 3, row_y, True, "mm:0"),
             Edge(3, 4, 4, False, "loss:0"), Edge(2, 4, row_y, True, "mm:0"), Edge(0, 5, row_x, True, "x:0"),
             Edge(4, 5, row_y, True, "dy:0"), Edge(5, 6, W_BYTES, False, "gw:0")]
    return OpGraph("dense", batch, ops, edges, [Variable("w", (K, M), "float32", W_BYTES, True, "model", "gw")])


def linear_profiles(graph: OpGraph, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)) -> pd.DataFrame:
    """Ops that read the batch take US_PER_SAMPLE per sample (gw too: its inputs carry the batch)."""
    scales = {"x", "mm", "loss", "dy", "gw"}
    rows = [(graph.model, op.name, GTX, b, 0, US_PER_SAMPLE * b if op.name in scales else 5.0)
            for b in batches for op in graph.ops]
    return pd.DataFrame(rows, columns=["model", "op", "device_type", "batch_size", "run", "time_us"])


TWO_GTX = topology(("a", GTX, 1, 64.0), ("b", GTX, 1, 64.0), inter_gbps=10.0)  # the paper's Table V pair


def _dp(graph: OpGraph, option: str = "allreduce") -> Strategy:
    return Strategy.uniform(len(graph.ops), 2, 2, option, overlap=False)


def _hand_saving(batch: int) -> float:
    """AllReduce of dW saved, minus gathering x and dY and running gw on the whole batch instead of half."""
    saved = hierarchical_allreduce_time(W_BYTES, [1, 1], [64.0, 64.0], 10.0)
    gather = allgather_time(4 * K * batch, 2, 10.0) + allgather_time(4 * M * batch, 2, 10.0)
    extra = US_PER_SAMPLE * 1e-6 * (batch - batch / 2)
    return saved - gather - extra


def test_a_matmul_gradient_wins_at_a_small_batch_and_loses_at_a_large_one():
    g = dense_graph()
    for batch, wins in ((16, True), (512, False)):
        sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=batch)
        (decision,) = decide(sim, _dp(g))
        expected = _hand_saving(batch)
        assert (expected > 0) == wins
        if wins:
            assert decision.status == "sfb"
            assert decision.duplicated == [g.index["gw"]]
            assert decision.gathered == [g.index["x"], g.index["dy"]]
            assert decision.saving_s == pytest.approx(expected, rel=1e-9)
            assert decision.solve_s > 0
        else:
            # The bound (saving <= gw's extra compute + the cheapest gather) rules it out without a solve.
            assert decision.status == "ruled_out" and decision.duplicated == [] and decision.solve_s == 0.0
    # The simulator agrees at batch 16: SFB kept, no AllReduce left, the step faster.
    sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=16)
    result = apply_sfb(sim, _dp(g))
    assert result.kept == ["w"] and result.strategy.sfb == {"w": [g.index["gw"]]}
    assert result.time_with_s < result.time_without_s
    after = sim.run(result.strategy)
    assert after.comm_s["allreduce"] == 0.0 and after.comm_s["allgather"] > 0.0


def test_a_solve_past_its_time_limit_keeps_the_gradient_synchronised():
    g = dense_graph()
    sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=16)
    with pytest.warns(UserWarning, match=r"SFB for w: the MILP did not finish within 1e-06 s"):
        result = apply_sfb(sim, _dp(g), time_limit_s=1e-6)
    (decision,) = result.decisions
    assert decision.status == "timeout" and decision.duplicated == []
    assert result.kept == [] and result.strategy.sfb == {}
    assert result.time_with_s == result.time_without_s == sim.run(_dp(g)).iteration_time_s


def test_a_trial_runs_only_while_the_deadline_says_one_more_simulation_fits():
    g = dense_graph()
    sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=16)
    decisions = decide(sim, _dp(g))
    asked: list[float] = []
    refused = apply_sfb(sim, _dp(g), decisions=decisions, keep_going=lambda s: asked.append(s) or False)
    assert len(asked) == 1 and asked[0] > 0  # asked with the time the plan without SFB took
    assert refused.kept == [] and refused.time_with_s == refused.time_without_s
    assert refused.decisions == decisions  # the report still lists what the MILPs chose
    allowed = apply_sfb(sim, _dp(g), decisions=decisions, keep_going=lambda s: True)
    assert allowed.kept == ["w"] and allowed.time_with_s < allowed.time_without_s


def test_sfb_in_a_ps_group_saves_the_push():
    g = dense_graph()
    sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=16)
    result = apply_sfb(sim, _dp(g, "ps"))
    assert result.kept == ["w"]
    after = sim.run(result.strategy)
    assert after.comm_s["ps_push"] == 0.0 and after.comm_s["gather"] > 0.0
    assert result.time_with_s < result.time_without_s


def test_subgraphs_take_only_exclusive_backward_ops_of_replicated_gradients():
    g = dense_graph()
    sim = Simulator(g, TWO_GTX, linear_profiles(g))
    (sub,) = find_subgraphs(sim, _dp(g))
    # dy also feeds nothing else here, so it may be duplicated with gw; mm (forward) may not.
    assert sub.ops == [g.index["gw"], g.index["dy"]]
    assert set(sub.partial_inputs) == {g.index["loss"]}  # the loss reaches dy without the batch axis
    assert find_subgraphs(sim, _dp(g, "duplicate")) == []  # nothing synchronised, nothing to decide
    one = topology(("a", GTX, 1, 64.0), ("b", GTX, 1, 64.0), inter_gbps=10.0)
    only_a = Strategy.uniform(len(g.ops), 2, 2, "allreduce", mask=np.array([True, False]))
    assert find_subgraphs(Simulator(g, one), only_a) == []  # one replica: no sync


def batched_graph(batch: int = 8) -> OpGraph:
    """Keras' Dense on 3-D inputs: gw = Reshape(Sum over the batch of BatchMatMul(x, dY))."""
    row_x, row_y, outer = 4 * K * batch, 4 * M * batch, W_BYTES * batch
    ops = [
        Op("x", "Placeholder", row_x, 0, is_input=True, batch_scaled=True),
        Op("dy", "Placeholder", row_y, 0, is_input=True, batch_scaled=True),
        Op("bmm", "BatchMatMulV2", outer, 2 * batch * K * M, is_gradient=True, batch_scaled=True),
        Op("sum", "Sum", W_BYTES, batch * K * M, is_gradient=True),
        Op("gw", "Reshape", W_BYTES, 0, is_gradient=True),
        Op("apply", "AssignSubVariableOp", 0, K * M, is_apply=True, variable="w"),
    ]
    edges = [Edge(0, 2, row_x, True, "x:0"), Edge(1, 2, row_y, True, "dy:0"), Edge(2, 3, outer, True, "bmm:0"),
             Edge(3, 4, W_BYTES, False, "sum:0"), Edge(4, 5, W_BYTES, False, "gw:0")]
    return OpGraph("batched", batch, ops, edges, [Variable("w", (K, M), "float32", W_BYTES, True, "model", "gw")])


def test_a_partial_sum_inside_the_subgraph_is_duplicated_with_its_consumers_or_not_at_all():
    g = batched_graph()
    sim = Simulator(g, TWO_GTX, linear_profiles(g), batch_size=4)
    (sub,) = find_subgraphs(sim, _dp(g))
    assert sorted(sub.ops) == [g.index[n] for n in ("bmm", "sum", "gw")]
    assert sub.partial_inputs == {g.index["sum"]: [g.index["gw"]]}
    (decision,) = decide(sim, _dp(g))
    # Duplicating the Reshape alone would need the replicas' partial sums: the factors x and dY are gathered.
    assert decision.status == "sfb"
    assert decision.duplicated == sorted(g.index[n] for n in ("bmm", "sum", "gw"))
    assert decision.gathered == [g.index["x"], g.index["dy"]]


def test_strategy_json_keeps_sfb_and_rejects_bad_entries():
    g = dense_graph()
    s = replace(_dp(g), sfb={"w": [5]})
    again = Strategy.from_json(s.to_json())
    assert again.sfb == {"w": [5]} and again.key() == s.key() != _dp(g).key()
    from tag_core.errors import TagInputError

    with pytest.raises(TagInputError, match=r"sfb\['w'\]"):
        Strategy.from_dict({**s.to_dict(), "sfb": {"w": ["gw"]}})
    with pytest.raises(TagInputError, match=r"sfb\['w'\]: op indices must lie in \[0, 7\)"):
        Simulator(g, TWO_GTX).run(replace(_dp(g), sfb={"w": [99]}))
    with pytest.raises(TagInputError, match=r"sfb\['nope'\]: names no variable"):
        Simulator(g, TWO_GTX).run(replace(_dp(g), sfb={"nope": [5]}))


def test_the_plan_json_carries_sfb_and_the_time_without_it():
    g = dense_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no solve may time out here
        result = plan(g, TWO_GTX, linear_profiles(g), batch_size=16, num_groups=2, budget=Budget(iterations=20))
    data = json.loads(json.dumps(result.to_dict()))
    sfb = data["sfb"]
    assert data["tag"]["iteration_time_s"] == sfb["iteration_time_s"] <= data["tag"]["iteration_time_s_without_sfb"]
    assert sfb["considered"] == sum(sfb["by_status"].values())
    for gradient in sfb["gradients"]:
        assert gradient["estimated_saving_s"] > 0 and gradient["op_types"]
    assert data["strategy"].get("sfb", {}) == {x["variable"]: [g.index[n] for n in x["duplicated"]] for x in sfb["gradients"]}
    skipped = plan(g, TWO_GTX, linear_profiles(g), batch_size=16, num_groups=2, budget=Budget(iterations=20), sfb=False)
    assert "sfb" not in skipped.to_dict() and "sfb" not in skipped.to_dict()["strategy"]


# ---- emitted SFB graphs on TF's runtime --------------------------------------------------


def _sfb_everywhere(option: str, fusion_bytes: int = 0):
    """The test topology's strategy with SFB on every synchronised gradient's whole subgraph."""
    from test_runtime import UNEVEN

    def build(graph, topo):
        s = Strategy.uniform(len(graph.ops), topo.num_machines, topo.num_devices, option, batch_shares=UNEVEN,
                             fusion_bytes=fusion_bytes, name=f"{option}+sfb")
        subs = find_subgraphs(Simulator(graph, topo), s)
        assert subs
        if fusion_bytes:  # every other gradient, so the rest still share a fused AllReduce
            subs = subs[::2]
        return replace(s, sfb={sub.variable: sub.ops for sub in subs})
    return build


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,option,fusion_bytes", [
    ("mlp", "allreduce", 0), ("mlp", "ps", 0), ("mlp", "allreduce", 64 * 2**20), ("transformer", "allreduce", 0)])
def test_emitted_sfb_step_matches_single_device(tmp_path, model, option, fusion_bytes):
    from test_runtime import _emit_run

    emission, result, lines = _emit_run(tmp_path, model, _sfb_everywhere(option, fusion_bytes), steps=2)
    assert result.ok, "\n".join(lines)
    for step in result.steps:
        assert step["passed"] and step["max_relative_difference"] <= 1e-4
        noise = len(step.get("noise_gradient_variables", []))
        assert step["compared"]["variables"] == len(emission.reference.variables) - noise
    # The gradients are rebuilt on every replica from gathered factors: no collective sums them.
    reduced = {c.tensor for c in emission.emitted.collectives}
    gradient_ops = {v.gradient_op for v in emission.graph.variables if v.name in emission.strategy.sfb}
    assert gradient_ops
    assert not any(t.split(":")[0] in gradient_ops for t in reduced)
    if option == "allreduce":
        assert "full" in {p.kind for p in emission.placed.placements}
    if fusion_bytes:
        assert emission.emitted.collectives  # the gradients left out of SFB are still summed


# ---- the CLI ---------------------------------------------------------------------------------

TWO_GTX_JSON = {"name": "two-gtx", "inter_gbps": 10, "machines": [
    {"name": "a", "gpu": "GTX1080Ti", "count": 1, "intra_gbps": 64},
    {"name": "b", "gpu": "GTX1080Ti", "count": 1, "intra_gbps": 64}]}


@pytest.mark.slow
def test_tag_sfb_prints_the_decisions(tag_home, tmp_path, capsys):
    from tag_core.cli import main

    topo = tmp_path / "two.json"
    topo.write_text(json.dumps(TWO_GTX_JSON))
    model = "mlp[features=64,hidden=64]"
    assert main(["sfb", model, "--topology", str(topo), "--batch-size", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"] == "dp-nccl" and data["batch_size"] == 2
    assert data["considered"] == len(data["decisions"]) == 6  # three Dense layers: kernel and bias each
    assert {d["status"] for d in data["decisions"]} <= {"sfb", "no_gain", "ruled_out", "timeout"}
    assert data["iteration_time_s"] <= data["iteration_time_s_without_sfb"]
    kept = {g["variable"] for g in data["gradients"]}
    assert kept <= {d["variable"] for d in data["decisions"] if d["status"] == "sfb"}
    assert main(["sfb", model, "--topology", str(topo), "--batch-size", "2", "--all"]) == 0
    text = capsys.readouterr().out
    assert "without SFB" in text and "median" in text and "mlp/dense/kernel" in text


@pytest.mark.parametrize("args, fragment", [
    (["--time-limit", "0"], "--time-limit: must be a positive number"),
    (["--plan", "{missing}"], "--plan: "),
    (["--plan", "{bad}"], "bad.json: num_ops: required"),
    (["--strategy", "fastest"], "--strategy: unknown baseline 'fastest'"),
])
def test_tag_sfb_bad_input_exits_2_with_one_line(tmp_path, args, fragment):
    from test_cli import error_lines, run_tag

    topo = tmp_path / "two.json"
    topo.write_text(json.dumps(TWO_GTX_JSON))
    bad = tmp_path / "bad.json"
    bad.write_text('{"groups": [{"mask": [1], "option": "allreduce"}], "batch_shares": [1, 1]}')
    values = {"missing": str(tmp_path / "none.json"), "bad": str(bad)}
    result = run_tag("sfb", "mlp[features=8,hidden=8]", "--topology", str(topo), *[a.format(**values) for a in args],
                     cwd=tmp_path, home=tmp_path / "home")
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert not (tmp_path / "home").exists(), "bad input is refused before anything is captured"
