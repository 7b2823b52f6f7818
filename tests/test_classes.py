"""Machine classes: detection, the deterministic choice of concrete machines, class-level action
spaces, and class collapse in the simulator (one representative per class, exact)."""

from __future__ import annotations

import numpy as np
import pytest
from simgraphs import profiles, train_graph

from tag_core.cluster import Machine, Topology, lookup_gpu
from tag_core.cluster.classes import choose_machines, class_mask, machine_class_of, machine_classes
from tag_core.search.baselines import device_speed
from tag_core.search.space import PER_MACHINE_UP_TO, ActionSpace
from tag_core.simulate import Simulator, Strategy

V100, T4 = "V100-32GB", "T4"


def _topo(*specs, links=()) -> Topology:
    machines = tuple(Machine(name, lookup_gpu(gpu), count, intra) for name, gpu, count, intra in specs)
    return Topology("t", machines, inter_gbps=25.0, links=tuple(links))


def test_identical_machines_form_one_class():
    topo = _topo(("a", V100, 2, 100.0), ("b", T4, 2, 100.0), ("c", V100, 2, 100.0), ("d", V100, 4, 100.0),
                 ("e", V100, 2, 50.0), ("f", V100, 2, 100.0))
    classes = machine_classes(topo)
    assert [c.machines for c in classes] == [(0, 2, 5), (1,), (3,), (4,)]
    assert machine_class_of(topo).tolist() == [0, 1, 0, 2, 3, 0]


def test_a_link_override_sets_a_machine_apart():
    topo = _topo(("a", V100, 2, 100.0), ("b", V100, 2, 100.0), ("c", V100, 2, 100.0), links=[("a", "b", 10.0)])
    assert [c.machines for c in machine_classes(topo)] == [(0, 1), (2,)]


def test_choice_follows_machine_order_without_racks():
    topo = _topo(*[(f"m{i}", V100, 2, 100.0) for i in range(5)])
    (cls,) = machine_classes(topo)
    assert choose_machines(cls, 3) == (0, 1, 2)
    assert class_mask(topo, {0: 2}).tolist() == [True, True, False, False, False]
    with pytest.raises(ValueError):
        choose_machines(cls, 6)


def _racked(gpus_racks: list[tuple[str, str]], pods: dict[str, str] | None = None) -> Topology:
    """Machines of 2 GPUs given as (gpu, rack); racks listed in order of first use, in `pods` when given."""
    from tag_core.cluster.hierarchy import Rack, Uplink

    machines = tuple(Machine(f"m{i}", lookup_gpu(gpu), 2, 100.0, rack=r) for i, (gpu, r) in enumerate(gpus_racks))
    names = list(dict.fromkeys(r for _, r in gpus_racks))
    racks = tuple(Rack(r, pods[r] if pods else None) for r in names)
    return Topology("racked", machines, inter_gbps=25.0, racks=racks, rack_uplink=Uplink(25.0, 4.0),
                    pod_uplink=Uplink(10.0, 2.0) if pods else None)


def test_choice_packs_the_fullest_rack_first():
    # Three racks of three machines; the V100s fill r2, two thirds of r1 and a third of r3.
    topo = _racked([(V100, "r1"), (V100, "r2"), (V100, "r2"), (V100, "r1"), (V100, "r2"), (V100, "r3"),
                    (T4, "r1"), (T4, "r3"), (T4, "r3")])
    cls = machine_classes(topo)[0]  # racks of one size: their V100 machines are one class
    assert cls.machines == (1, 2, 4, 0, 3, 5)
    assert choose_machines(cls, 3) == (1, 2, 4)  # all of r2's (the fullest) before r1's
    assert choose_machines(cls, 4) == (1, 2, 4, 0)
    assert choose_machines(cls, 3) == choose_machines(machine_classes(topo)[0], 3)  # deterministic


def test_racks_of_different_sizes_set_their_machines_apart():
    """A flow out of a rack of n machines gets gbps * min(1, n / (o * k)) of the uplink: machines in racks
    of different sizes (or pods of different sizes) cost differently, so they are different classes."""
    uneven = _racked([(V100, "r0")] * 3 + [(V100, "r1")] + [(V100, "r2")] * 3)
    assert [c.machines for c in machine_classes(uneven)] == [(0, 1, 2, 4, 5, 6), (3,)]
    assert machine_class_of(uneven).tolist() == [0, 0, 0, 1, 0, 0, 0]
    pods = _racked([(V100, "r0")] * 2 + [(V100, "r1")] * 2 + [(V100, "r2")] * 2, pods={"r0": "p0", "r1": "p0",
                                                                                      "r2": "p1"})
    assert [c.machines for c in machine_classes(pods)] == [(0, 1, 2, 3), (4, 5)]
    # Deterministic: the same classes again, and whatever order the racks are listed in.
    listed = Topology("racked", uneven.machines, 25.0, racks=uneven.racks[::-1], rack_uplink=uneven.rack_uplink)
    assert machine_classes(listed) == machine_classes(uneven) == machine_classes(uneven)


def test_uneven_racks_simulate_as_with_every_device_simulated():
    """Classes split by rack size keep the simulator's class collapse exact."""
    g = train_graph(layers=2)
    topo = _racked([(V100, "r0")] * 3 + [(V100, "r1")] + [(T4, "r1")] * 2)
    prof = profiles(g, V100)
    collapsed, flat = Simulator(g, topo, prof), Simulator(g, topo, prof, collapse=False)
    for option in ("allreduce", "ps"):
        for mask in (np.ones(6, dtype=bool), class_mask(topo, {0: 2, 1: 1})):
            s = Strategy.uniform(len(g.ops), 6, topo.num_devices, option, mask=mask)
            assert collapsed.run(s).iteration_time_s == pytest.approx(flat.run(s).iteration_time_s, rel=1e-12)


def test_small_topologies_keep_a_mask_bit_per_machine():
    g = train_graph()
    topo = _topo(*[(f"m{i}", V100, 1, 100.0) for i in range(4)])
    sim = Simulator(g, topo, profiles(g, V100))
    space = ActionSpace.build(sim, device_speed(sim))
    assert {"m0", "m1", "m2", "m3", "all"} <= set(space.mask_names)


@pytest.mark.parametrize("per_class", [12, 40])
def test_class_action_space_does_not_grow_with_machines(per_class):
    g = train_graph()
    specs = [(f"{t}{i}", t, 2, 100.0) for i in range(per_class) for t in (V100, T4)]
    topo = _topo(*specs)
    assert topo.num_machines > PER_MACHINE_UP_TO
    sim = Simulator(g, topo, profiles(g, V100))
    space = ActionSpace.build(sim, device_speed(sim))
    assert len(space.masks) <= 16
    # k machines of one class: the first k of its machines in order
    name = next(n for n in space.mask_names if n.startswith(f"{per_class}x2x"))
    assert space.masks[space.mask_names.index(name)].sum() == per_class
    one = space.masks[space.mask_names.index(f"1x2x{V100}#0")]
    assert np.flatnonzero(one).tolist() == [0]


def _collapse_case():
    g = train_graph(layers=3)
    topo = _topo(*[(f"v{i}", V100, 2, 100.0) for i in range(3)], *[(f"t{i}", T4, 4, 60.0) for i in range(3)])
    prof = profiles(g, V100)
    return g, topo, prof


@pytest.mark.parametrize("option", ["allreduce", "ps", "duplicate", "model_parallel"])
@pytest.mark.parametrize("speed_shares", [False, True])
def test_class_collapse_matches_every_device_simulated(option, speed_shares):
    g, topo, prof = _collapse_case()
    collapsed, flat = Simulator(g, topo, prof), Simulator(g, topo, prof, collapse=False)
    shares = device_speed(collapsed) if speed_shares else None
    for mask in (np.ones(6, dtype=bool), class_mask(topo, {0: 2, 1: 2})):
        s = Strategy.uniform(len(g.ops), 6, topo.num_devices, option, batch_shares=shares, mask=mask)
        a, b = collapsed.run(s), flat.run(s)
        assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-12)
        assert np.allclose(a.peak_memory_bytes, b.peak_memory_bytes, rtol=1e-12)
        assert a.comm_s == pytest.approx(b.comm_s, rel=1e-9)
        if option == "allreduce":
            assert a.simulated_slots < b.simulated_slots == topo.num_devices


def test_identical_machines_listed_or_as_a_class_simulate_the_same():
    """A cluster of identical machines: the class-level plan "replicate on all k of class c" simulates
    exactly as the same plan with every machine listed, for every k."""
    g = train_graph(layers=2)
    topo = _topo(*[(f"m{i}", V100, 4, 100.0) for i in range(6)])
    prof = profiles(g, V100)
    sim, flat = Simulator(g, topo, prof), Simulator(g, topo, prof, collapse=False)
    (cls,) = machine_classes(topo)
    for k in range(1, 7):
        mask = class_mask(topo, {0: k})
        listed = np.zeros(6, dtype=bool)
        listed[list(range(k))] = True
        assert mask.tolist() == listed.tolist()
        s = Strategy.uniform(len(g.ops), 6, topo.num_devices, "allreduce", mask=mask)
        assert sim.run(s).iteration_time_s == pytest.approx(flat.run(s).iteration_time_s, rel=1e-12)


def test_class_collapse_with_groups_placed_apart():
    """Two op groups on different machine sets (point-to-point traffic between them) and a PS group."""
    g, topo, prof = _collapse_case()
    collapsed, flat = Simulator(g, topo, prof), Simulator(g, topo, prof, collapse=False)
    half = len(g.ops) // 2
    op_groups = np.array([0] * half + [1] * (len(g.ops) - half))
    for options in (["allreduce", "ps"], ["ps", "allreduce"], ["model_parallel", "ps"], ["duplicate", "allreduce"]):
        masks = np.array([np.ones(6, dtype=bool), class_mask(topo, {1: 3, 0: 1})])
        s = Strategy(op_groups, masks, options, device_speed(collapsed))
        a, b = collapsed.run(s), flat.run(s)
        assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-12)
        assert np.allclose(a.peak_memory_bytes, b.peak_memory_bytes, rtol=1e-12)
        assert a.comm_s == pytest.approx(b.comm_s, rel=1e-9)


def test_a_plan_on_many_machines_names_the_same_concrete_machines_every_time():
    """Beyond PER_MACHINE_UP_TO machines the planner's masks are class-level; the plan it returns names
    concrete machines, the first k of each class, and the same ones on every run."""
    from tag_core.cluster.classes import machine_classes
    from tag_core.plan.planner import plan
    from tag_core.search.mcts import Budget

    g = train_graph(layers=3)
    topo = _topo(*[(f"v{i}", V100, 2, 100.0) for i in range(10)], *[(f"t{i}", T4, 2, 60.0) for i in range(10)])
    prof = profiles(g, V100)
    runs = [plan(g, topo, prof, budget=Budget(iterations=12), sfb=False) for _ in range(2)]
    assert runs[0].strategy.to_dict() == runs[1].strategy.to_dict()
    classes = machine_classes(topo)
    choices = {class_mask(topo, {c: k}, classes).tobytes() for c in range(len(classes))
               for k in range(1, classes[c].size + 1)}
    space = runs[0].evaluator.space
    for mask, name in zip(space.masks, space.mask_names):
        if "x" in name and "#" in name:  # "k of class c": a prefix of the class's machines
            assert mask.tobytes() in choices
    assert runs[0].strategy.extra["machines"] == [m.name for m in topo.machines]


def test_a_large_re_slicing_is_one_unit_per_tensor_close_to_its_pieces(monkeypatch):
    """Split over 70 devices, wanted whole on 70 others (4900 pieces per edge): one gather unit per tensor
    costed by its busiest machine pair, near what the pieces one by one give."""
    import tag_core.simulate.reshard as reshard

    g = train_graph(layers=2)
    topo = _topo(*[(f"m{i}", V100, 1, 100.0) for i in range(100)])
    prof = profiles(g, V100)
    n = len(g.ops)
    first = np.zeros(100, dtype=bool)
    first[:70] = True
    s = Strategy((np.arange(n) > n // 2).astype(int), np.array([first, first[::-1]]), ["allreduce", "duplicate"],
                 np.ones(100))
    units = Simulator(g, topo, prof, batch_size=140).run(s)  # two rows a device
    monkeypatch.setattr(reshard, "MAX_P2P_ROWS", 10**9)
    monkeypatch.setattr(reshard, "MAX_UNIT_ROWS", 10**9)
    pieces = Simulator(g, topo, prof, batch_size=140).run(s)
    assert units.comm_s["gather"] > 0 and pieces.comm_s["gather"] > 0
    assert units.simulated_slots < pieces.simulated_slots
    assert 0.5 < units.iteration_time_s / pieces.iteration_time_s < 2.0


def test_an_all_reduce_across_oversubscribed_racks_costs_more():
    """On racks, gradient all-reduce goes by the tiers of CommModel.allreduce_tiers: a 4x oversubscribed
    uplink makes the all-machines plan slower; a plan inside one rack does not cross it."""
    from tag_core.cluster.hierarchy import Rack, Uplink

    g = train_graph(layers=2)
    prof = profiles(g, V100)

    def racked(oversubscription: float) -> Topology:
        machines = tuple(Machine(f"m{i}", lookup_gpu(V100), 2, 100.0, rack=f"r{i // 4}") for i in range(8))
        return Topology("two-racks", machines, inter_gbps=25.0, racks=(Rack("r0"), Rack("r1")),
                        rack_uplink=Uplink(25.0, oversubscription))

    times = {}
    for o in (1.0, 4.0):
        topo = racked(o)
        sim = Simulator(g, topo, prof, batch_size=32)  # rows on every device
        everywhere = Strategy.uniform(len(g.ops), 8, 16, "allreduce")
        one_rack = Strategy.uniform(len(g.ops), 8, 16, "allreduce", mask=np.arange(8) < 4)
        times[o] = (sim.run(everywhere).iteration_time_s, sim.run(one_rack).iteration_time_s)
    assert times[4.0][0] > times[1.0][0]
    assert times[4.0][1] == pytest.approx(times[1.0][1], rel=1e-12)
