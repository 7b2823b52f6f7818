"""Random clusters of a given size, optionally in racks and pods: `tag topology random --gpus N [--racks R]`.

Built for thousands of GPUs: machines of one GPU type share one size and one intra_gbps (as a
cluster's identical servers do), there are no per-pair links, and racks carry the unevenness
through their oversubscribed uplinks. So machines fall into a few classes however many there are,
and a topology of 8192 GPUs is about a thousand Machine objects, built in well under a second.
"""

from __future__ import annotations

import random

from tag_core.errors import TagInputError

from .fields import MAX_DEVICES
from .gpu_catalog import CATALOG
from .hierarchy import Rack, Uplink
from .topology import RANDOM_GPU_POOL, RANDOM_INTER_GBPS, RANDOM_INTRA_GBPS, Machine, Topology

MACHINE_SIZES = (4, 8)  # GPUs per machine, drawn once per GPU type
OVERSUBSCRIPTION = (1.0, 2.0, 3.0, 4.0)  # rack uplinks; pods draw from the top half
RACK_LATENCY_US = (15.0, 30.0)  # in-rack transfers keep the cost model's 12 µs
POD_LATENCY_US = (30.0, 60.0)


def sized_topology(seed: int, gpus: int | None, racks: int | None = None, pods: int | None = None,
                   types: int = 3) -> Topology:
    """`gpus` GPUs of `types` types from RANDOM_GPU_POOL; machine i of type t has the type's size (the
    last machine takes what is left). With `racks`, machines are split into that many racks in order,
    as evenly as they go; with `pods`, racks into pods likewise. Deterministic for its arguments."""
    if gpus is None:
        raise TagInputError("--gpus", "missing: --racks, --pods and --types draw a cluster of a given size")
    _check(gpus, "--gpus", MAX_DEVICES)
    _check(types, "--types", len(RANDOM_GPU_POOL))
    if pods is not None:
        _check(pods, "--pods", None)
        if racks is None:
            raise TagInputError("--pods", "needs --racks: pods group racks")
    rng = random.Random(f"tag-topology-{seed}-{gpus}-{racks}-{pods}-{types}")  # str seed: stable across versions
    chosen = rng.sample(RANDOM_GPU_POOL, types)
    spec = {t: (rng.choice(MACHINE_SIZES), round(rng.uniform(*RANDOM_INTRA_GBPS), 1)) for t in chosen}
    inter = round(rng.uniform(*RANDOM_INTER_GBPS), 1)
    drawn: list[tuple[str, int]] = []
    left = gpus
    while left > 0:
        gpu = rng.choice(chosen)
        count = min(spec[gpu][0], left)
        drawn.append((gpu, count))
        left -= count
    n = len(drawn)
    name = f"random-{seed}-{gpus}g" + (f"-{types}t" if types != 3 else "")
    if racks is None:
        machines = tuple(Machine(f"m{i}-{g.lower()}", CATALOG[g], c, spec[g][1]) for i, (g, c) in enumerate(drawn))
        return Topology(name=name, machines=machines, inter_gbps=inter)
    _check(racks, "--racks", n)
    rack_names = [f"r{j}" for j in range(racks)]
    machines = tuple(Machine(f"m{i}-{g.lower()}", CATALOG[g], c, spec[g][1], rack=rack_names[i * racks // n])
                     for i, (g, c) in enumerate(drawn))
    # One flow alone gets at most its NIC across the uplink; when every machine sends, 1/o of it.
    rack_uplink = Uplink(round(rng.uniform(RANDOM_INTER_GBPS[0], inter), 1), rng.choice(OVERSUBSCRIPTION),
                         round(rng.uniform(*RACK_LATENCY_US), 1))
    if pods is None:
        return Topology(name=f"{name}-{racks}r", machines=machines, inter_gbps=inter,
                        racks=tuple(Rack(r) for r in rack_names), rack_uplink=rack_uplink)
    _check(pods, "--pods", racks)
    pod_uplink = Uplink(round(rng.uniform(RANDOM_INTER_GBPS[0] / 2, rack_uplink.gbps), 1),
                        rng.choice(OVERSUBSCRIPTION[2:]), round(rng.uniform(*POD_LATENCY_US), 1))
    rack_list = tuple(Rack(r, pod=f"p{j * pods // racks}") for j, r in enumerate(rack_names))
    return Topology(name=f"{name}-{racks}r-{pods}p", machines=machines, inter_gbps=inter, racks=rack_list,
                    rack_uplink=rack_uplink, pod_uplink=pod_uplink)


def _check(value, flag: str, most: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TagInputError(flag, f"must be a positive integer, got {value!r}")
    if most is not None and value > most:
        what = {"--gpus": "GPUs TAG plans", "--types": "GPU types in the random pool",
                "--racks": "machines drawn", "--pods": "racks"}[flag]
        raise TagInputError(flag, f"must be at most {most} (the {what}), got {value}")
