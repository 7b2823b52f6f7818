"""What a step costs its client beyond the devices' schedule.

On a local cluster the session's master runs in the client's own process (tag_core.runtime.local_cluster),
so a step's launch reaches every task that runs an op, and only those. A calibrated model
(`CommModel.client_feeds`) also charges the batch the client feeds: the whole batch goes from the
client's process to the task of each input op (the calibration's "client" link, when it measured one);
the emitter places each input op whole on the first device of its placement and sends each other replica
its rows from there, so those bytes cross before that machine's share of the step can start, and leave
once the first machine's share, which starts with them, lets its threads run (`CommModel.busy_send_s`).
Uncalibrated, the paper's setting holds: each worker reads its own data.
"""

from __future__ import annotations

import numpy as np

from .cost import bytes_per_s
from .strategy import Strategy
from .units import FULL, SINGLE, Placement


def client_cost_s(ctx, s: Strategy, p: Placement, device_busy_s: np.ndarray) -> float:
    """The step's launch on the tasks it touches, plus the feed when the model charges it."""
    machines = set(ctx.dev_machine[device_busy_s > 0].tolist())
    cost = ctx.comm.step_cost(max(len(machines), 1))
    if ctx.comm.client_feeds:
        cost += feed_time_s(ctx, s, p)
    return cost


def feed_time_s(ctx, s: Strategy, p: Placement) -> float:
    """The client's feed to the input ops' tasks, then the slowest machine's wait for the rows sent on from
    there: they leave in parallel, one message per machine pair."""
    arriving: dict[tuple[int, int], float] = {}  # (from machine, to machine) -> bytes
    inputs = np.flatnonzero(ctx.is_input)
    fed = ctx.comm.feed_fit.seconds(float(ctx.act_bytes[inputs].sum())) if ctx.comm.feed_fit and len(inputs) else 0.0
    for op in inputs:
        whole = float(ctx.act_bytes[op])
        if p.kind[op] == SINGLE:
            devices, fractions = np.array([p.single_dev[op]]), np.ones(1)
        else:
            group = s.op_groups[op]
            devices = np.flatnonzero(p.group_active[group])
            fractions = np.ones(len(devices)) if p.kind[op] == FULL else p.group_share[group, devices]
        first = int(ctx.dev_machine[devices[0]])
        for device, fraction in zip(devices[1:], fractions[1:]):
            to = int(ctx.dev_machine[device])
            if to != first:
                arriving[(first, to)] = arriving.get((first, to), 0.0) + whole * fraction
    if not arriving:
        return fed
    # The first machine starts its own share as its rows leave: its compute holds them (comm_loop.py).
    return fed + ctx.comm.busy_send_s + max(ctx.comm.inter_latency_s + nbytes / bytes_per_s(ctx.machine_bw[a, b])
                                            for (a, b), nbytes in arriving.items())
