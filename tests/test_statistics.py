"""All-reduces of batch statistics (tag_core.simulate.statistics): the replicas of a split group sum a
batch-wide figure that is not a gradient, and the ops that read it wait."""

from __future__ import annotations

import pytest
from simgraphs import fixed_profiles, profiles, topology, train_graph

from tag_core.errors import TagInputError
from tag_core.simulate import Simulator, Strategy
from tag_core.simulate.cost import ring_allreduce_time

V100 = "V100-32GB"


def _run(graph, topo, option="allreduce", statistics=()):
    strategy = Strategy.uniform(len(graph.ops), topo.num_machines, topo.num_devices, option, overlap=False)
    return Simulator(graph, topo, profiles(graph, V100), statistics=statistics).run(strategy)


def test_a_statistic_of_replicas_adds_an_allreduce_on_the_path_of_its_readers():
    g = train_graph(layers=2)
    intra = 50.0
    two = topology(("m", V100, 2, intra))
    plain = _run(g, two)
    summed = _run(g, two, statistics=[g.index["loss"]])  # the loss's 4 bytes, read by the backward pass
    expected = ring_allreduce_time(4, 2, intra)
    assert summed.iteration_time_s == pytest.approx(plain.iteration_time_s + expected, rel=1e-9)
    assert summed.comm_s["allreduce"] == pytest.approx(plain.comm_s["allreduce"] + expected, rel=1e-9)
    backward = g.index["dmm1"]
    assert summed.op_start_s[backward] == pytest.approx(plain.op_start_s[backward] + expected, rel=1e-9)


def test_one_copy_or_full_copies_sum_nothing():
    g = train_graph()
    loss = g.index["loss"]
    one = topology(("m", V100, 1, 50.0))
    assert _run(g, one, statistics=[loss]).iteration_time_s == _run(g, one).iteration_time_s
    two = topology(("m", V100, 2, 50.0))  # duplicate: every copy computes the whole batch's loss
    assert (_run(g, two, "duplicate", statistics=[loss]).iteration_time_s
            == _run(g, two, "duplicate").iteration_time_s)


@pytest.mark.parametrize("bad", [[-1], [10_000]])
def test_statistics_outside_the_graph_are_refused(bad):
    g = train_graph()
    with pytest.raises(TagInputError, match="statistics"):
        Simulator(g, topology(("m", V100, 1, 50.0)), statistics=bad)


@pytest.mark.slow
def test_an_emitted_graph_names_its_statistics_and_its_prediction_charges_them():
    from tag_core.capture import resolve_model
    from tag_core.cluster import parse_topology
    from tag_core.emit import emit
    from tag_core.emit.nodes import parse_input
    from tag_core.emit.prediction import predict_emission, statistic_ops
    from tag_core.simulate.comm import CommModel

    two = parse_topology({"name": "two", "inter_gbps": 10, "machines": [
        {"name": "a", "gpu": "V100-32GB", "count": 1, "intra_gbps": 100},
        {"name": "b", "gpu": "V100-32GB", "count": 1, "intra_gbps": 100}]})

    def data_parallel(graph, topo):
        return Strategy.uniform(len(graph.ops), topo.num_machines, topo.num_devices, "allreduce", name="dp")

    # A masked mean loss divides by a count that depends on the batch: each replica holds part of it.
    transformer = emit(resolve_model("transformer[layers=1,d_model=32,heads=2,ff=64,vocab=50,seq_len=8]", 8), two,
                       data_parallel, "cpu")
    found = statistic_ops(transformer)
    gradients = {parse_input(v.gradient)[0] for v in transformer.reference.variables if v.gradient}
    reduced = {parse_input(c.tensor)[0] for c in transformer.emitted.collectives}
    names = {transformer.graph.ops[i].name for i in found}
    assert found and names <= reduced - gradients
    predicted = predict_emission(transformer, None, CommModel(), None)
    assert predicted["statistics_summed"] == len(found)
    plain = Simulator(transformer.graph, two, batch_size=8).run(transformer.strategy)
    assert predicted["iteration_time_s"] > plain.iteration_time_s
    # An mlp's loss is a plain mean over a batch of known size: only its gradients are summed.
    mlp = emit(resolve_model("mlp[features=12,hidden=16]", 8), two, data_parallel, "cpu")
    assert statistic_ops(mlp) == [] and "statistics_summed" not in predict_emission(mlp, None, CommModel(), None)


def test_a_statistic_waits_while_its_members_compute_as_a_busy_senders_tensor_does():
    from tag_core.capture import Edge, Op, OpGraph
    from tag_core.simulate import CommModel

    # x, then the statistic s, then w (computes on, independent of s), then r (reads s).
    g = OpGraph("stat", 2, [Op("x", "Relu", 4, 0), Op("s", "Sum", 4, 0), Op("w", "Relu", 4, 0),
                            Op("r", "Mul", 4, 0)],  # a batch of 2: a row for each replica
                [Edge(0, 1, 4, False, "x:0"), Edge(0, 2, 4, False, "x:0"), Edge(1, 3, 4, False, "s:0")], [])
    topo = topology(("m0", V100, 1, 100.0), ("m1", V100, 1, 100.0), inter_gbps=10.0)
    strategy = Strategy.uniform(4, 2, 2, "allreduce", overlap=False)
    delay = 3e-3
    cases = {  # x's time (us), and when the all-reduce of s starts with the delay
        "the members have just begun": (5.0, delay),  # they compute w: their threads wait for the scheduler
        "the members have computed long enough": (10_000.0, 10_005e-6),  # s is ready at 10.005 ms: no wait
    }
    for name, (x_us, start) in cases.items():
        times = {"x": x_us, "s": 5.0, "w": 20_000.0, "r": 5.0}
        prof = fixed_profiles(g, V100, times, batches=(1, 2))
        starts = {}
        for d in (0.0, delay):
            sim = Simulator(g, topo, prof, comm=CommModel(busy_send_s=d), statistics=[g.index["s"]])
            starts[d] = sim.run(strategy, timeline=True).timeline.comm_start.min()
        assert starts[0.0] == pytest.approx(1e-6 * (x_us + 5.0)), name
        assert starts[delay] == pytest.approx(start), name
