"""What a step costs its client beyond the devices' schedule.

On a local cluster the session's master runs in the client's own process (tag_core.runtime.local_cluster),
so a step's launch reaches every task that runs an op, and only those. A calibrated model
(`CommModel.client_feeds`) also charges the batch the client feeds. TF's master feeds from the client's
device, so every task that reads an input op whole (a duplicated one) gets its own copy straight from the
client. A split input is read whole by the first device of its placement, which slices it and sends each
other replica its rows: those bytes cross before that machine's share of the step can start, and leave once
the first machine's compute, which starts with them, lets its threads run (`CommModel.busy_send_s`, at
most that machine's compute: measured on two local servers, rows sliced on a task that computes 1 or 2 ms
left when it was done). Uncalibrated, the paper's setting holds: each worker reads its own data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import bytes_per_s
from .strategy import Strategy
from .units import FULL, SINGLE, Placement


@dataclass
class Feed:
    """Where a step's input bytes go: from the client (`fed_bytes`, each whole copy counted) and, as rows
    sliced on the first machine, from there to the others ((from machine, to machine) -> bytes)."""
    fed_bytes: float = 0.0
    forwarded: dict[tuple[int, int], float] = field(default_factory=dict)


def plan_feed(ctx, s: Strategy, p: Placement) -> Feed | None:
    """The step's feed when the model charges it (None: each worker reads its own data)."""
    if not ctx.comm.client_feeds:
        return None
    feed = Feed()
    for op in np.flatnonzero(ctx.is_input):
        whole = float(ctx.act_bytes[op])
        feed.fed_bytes += whole
        if p.kind[op] == SINGLE:
            continue
        group = s.op_groups[op]
        devices = np.flatnonzero(p.group_active[group])
        machines = ctx.dev_machine[devices]
        first = int(machines[0])
        if p.kind[op] == FULL:  # each other machine's copy reads the input itself: one more copy from the client
            feed.fed_bytes += whole * (len(np.unique(machines)) - 1)
            continue
        shares = np.bincount(machines, weights=p.group_share[group, devices])
        for to in np.flatnonzero(shares).tolist():
            if to != first:
                feed.forwarded[(first, to)] = feed.forwarded.get((first, to), 0.0) + whole * float(shares[to])
    return feed


def client_cost_s(ctx, feed: Feed | None, device_busy_s: np.ndarray) -> float:
    """The step's launch on the tasks it touches, plus the feed when the model charges it."""
    machines = set(ctx.dev_machine[device_busy_s > 0].tolist())
    cost = ctx.comm.step_cost(max(len(machines), 1))
    if feed is not None:
        cost += feed_time_s(ctx, feed, device_busy_s)
    return cost


def feed_time_s(ctx, feed: Feed, device_busy_s: np.ndarray) -> float:
    """The client's feed, then the slowest machine's wait for the rows sent on to it: they leave in parallel,
    one message per machine pair, once the sending machine's compute lets them."""
    fed = ctx.comm.feed_fit.seconds(feed.fed_bytes) if ctx.comm.feed_fit and feed.fed_bytes else 0.0
    if not feed.forwarded:
        return fed
    machine_busy = np.zeros(int(ctx.dev_machine.max()) + 1)
    np.maximum.at(machine_busy, ctx.dev_machine, device_busy_s)
    return fed + max(min(ctx.comm.busy_send_s, float(machine_busy[a]))
                     + ctx.comm.inter_latency_s + nbytes / bytes_per_s(ctx.machine_bw[a, b])
                     for (a, b), nbytes in feed.forwarded.items())
