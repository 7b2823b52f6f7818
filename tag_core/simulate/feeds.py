"""What a step costs its client beyond the devices' schedule.

In TAG's emitted runtime the client runs every step through task 0 (machine 0, the master): the step's
launch reaches task 0 and every task that runs an op, so a step on machine 1 alone still touches two
tasks. A calibrated model (`CommModel.client_feeds`) also charges the batch the client feeds: the
emitter places each input op whole on the first device of its placement and sends each other replica
its rows from there, so the bytes that land on a machine other than 0 cross before that machine's
share of the step can start; before that, the whole batch goes from the client's process to task 0
(the calibration's "client" link, when it measured one). Uncalibrated, the paper's setting holds: each
worker reads its own data.
"""

from __future__ import annotations

import numpy as np

from .cost import bytes_per_s
from .strategy import Strategy
from .units import FULL, SINGLE, Placement

MASTER = 0  # the machine whose task the client talks to


def client_cost_s(ctx, s: Strategy, p: Placement, device_busy_s: np.ndarray) -> float:
    """The step's launch on the tasks it touches, plus the feed when the model charges it."""
    machines = set(ctx.dev_machine[device_busy_s > 0].tolist()) | {MASTER}
    cost = ctx.comm.step_cost(len(machines))
    if ctx.comm.client_feeds:
        cost += feed_time_s(ctx, s, p)
    return cost


def feed_time_s(ctx, s: Strategy, p: Placement) -> float:
    """The client's feed to task 0, then the slowest machine's wait for its bytes: they leave machine 0 in
    parallel, one message each."""
    arriving = np.zeros(len(ctx.machine_bw))
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
        first = ctx.dev_machine[devices[0]]
        arriving[first] += whole
        for device, fraction in zip(devices[1:], fractions[1:]):
            if ctx.dev_machine[device] != first:
                arriving[ctx.dev_machine[device]] += whole * fraction
    arriving[MASTER] = 0.0
    machines = np.flatnonzero(arriving > 0)
    if len(machines) == 0:
        return fed
    rates = np.array([bytes_per_s(ctx.machine_bw[MASTER, m]) for m in machines])
    return fed + float(np.max(ctx.comm.inter_latency_s + arriving[machines] / rates))
