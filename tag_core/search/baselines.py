"""Data-parallel baselines, as strategies the simulator scores like any plan.

- dp-nccl:   every device, equal batch split, one AllReduce per gradient after the
             backward pass (TF MirroredStrategy with NCCL).
- dp-nccl-p: the same, with the batch split in proportion to each device's speed.
- horovod:   equal split, gradients fused into 64 MiB buckets, each AllReduced as soon
             as its gradients are ready, overlapping the rest of the backward pass.
- single:    the whole step on the one device that runs it fastest (within memory).
"""

from __future__ import annotations

import numpy as np

from tag_core.errors import TagInputError
from tag_core.simulate.result import SimResult
from tag_core.simulate.simulator import Simulator
from tag_core.simulate.strategy import Strategy

BASELINES = ("dp-nccl", "dp-nccl-p", "horovod", "single")
HOROVOD_FUSION_BYTES = 64 * 2**20  # Horovod's default HOROVOD_FUSION_THRESHOLD


def device_speed(sim: Simulator) -> np.ndarray:
    """Samples per second of each device on its even share of the batch (compute only)."""
    share = sim.batch / sim.num_devices
    per_type: dict[str, float] = {}
    speed = np.empty(sim.num_devices)
    for d, gpu in enumerate(sim.dev_gpu):
        if gpu.name not in per_type:
            per_type[gpu.name] = share / max(float(sim.compute.times(gpu, share).sum()), 1e-12)
        speed[d] = per_type[gpu.name]
    return speed


def _all_devices(sim: Simulator, name: str, shares: np.ndarray, **kwargs) -> Strategy:
    return Strategy.uniform(sim.n, sim.topology.num_machines, sim.num_devices, "allreduce",
                            batch_shares=shares, name=name, **kwargs)


def dp_nccl(sim: Simulator) -> Strategy:
    return _all_devices(sim, "dp-nccl", np.ones(sim.num_devices), overlap=False)


def dp_nccl_p(sim: Simulator) -> Strategy:
    speed = device_speed(sim)
    return _all_devices(sim, "dp-nccl-p", speed / speed.sum(), overlap=False)


def horovod(sim: Simulator) -> Strategy:
    return _all_devices(sim, "horovod", np.ones(sim.num_devices), overlap=True, fusion_bytes=HOROVOD_FUSION_BYTES)


def single(sim: Simulator) -> Strategy:
    """The fastest single device that fits; the fastest overall when none fits."""
    best: tuple[bool, float, int] | None = None
    tried: set[tuple[str, float]] = set()
    for d, gpu in enumerate(sim.dev_gpu):
        if (gpu.name, gpu.mem_gb) in tried:  # devices of one type give the same answer
            continue
        tried.add((gpu.name, gpu.mem_gb))
        result = sim.run(_one_device(sim, d))
        candidate = (result.oom, result.iteration_time_s, d)
        if best is None or candidate < best:
            best = candidate
    return _one_device(sim, best[2])


def _one_device(sim: Simulator, device: int) -> Strategy:
    shares = np.zeros(sim.num_devices)
    shares[device] = 1.0
    return _all_devices(sim, "single", shares, overlap=True, extra={"device": device})


_BUILDERS = {"dp-nccl": dp_nccl, "dp-nccl-p": dp_nccl_p, "horovod": horovod, "single": single}


def baseline_name(name: str, where: str = "strategy") -> str:
    """`name` as one of BASELINES (case and _/- forgiven); TagInputError at `where` otherwise."""
    key = name.lower().replace("_", "-")
    if key not in _BUILDERS:
        raise TagInputError(where, f"unknown baseline {name!r}; known: {', '.join(BASELINES)} (or a plan .json file)")
    return key


def baseline(name: str, sim: Simulator) -> Strategy:
    """The strategy of baseline `name` (one of BASELINES) for this simulator's graph and topology."""
    return _BUILDERS[baseline_name(name)](sim)


def run_baselines(sim: Simulator, names: tuple[str, ...] = BASELINES) -> dict[str, tuple[Strategy, SimResult]]:
    """Each baseline's strategy and simulated result."""
    out = {}
    for name in names:
        strategy = baseline(name, sim)
        out[name] = (strategy, sim.run(strategy))
    return out
