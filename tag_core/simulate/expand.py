"""Per-strategy expansion for the simulator: where each op runs, what moves between devices.

Everything here is vectorised over ops and edges; Python loops run only over the few
distinct (source placement, destination placement) pairs, groups and sync units.

Placement kinds: SPLIT (replicated, each replica on its batch share), FULL (duplicated,
full batch everywhere), SINGLE (one device: model-parallel ops and PS updates). Ops that
Sufficient Factor Broadcasting duplicates (`Strategy.sfb`) run FULL on their replicated
group's devices (or SINGLE on the variable's PS).

Moves between placements are point-to-point transfers, except two collectives: rows split
over a group gathered by a full copy on the same devices (all-gather), and one holder's
tensor sent whole to several devices (broadcast).
"""

from __future__ import annotations

import numpy as np

from tag_core.errors import TagInputError

from .reshard import devices_of, is_large, reshard_units, rows_units, too_many_rows
from .strategy import Strategy
from .units import (
    ALLGATHER,
    ALLREDUCE,
    BROADCAST,
    FULL,
    GATHER,
    NORMAL,
    P2P,
    PS_PULL,
    PS_PUSH,
    PUSH,
    REDUCED,
    SINGLE,
    SPLIT,
    Collectives,
    Placement,
    Transfers,
    concat_collectives,
    no_collectives,
    no_transfers,
)


def place(ctx, s: Strategy) -> Placement:
    """Kinds, devices and batch fractions of every op under strategy `s`."""
    G, D = s.num_groups, ctx.num_devices
    shares = s.batch_shares
    active = s.masks[:, ctx.dev_machine] & (shares > 0)[None, :]
    for g in np.flatnonzero(~active.any(axis=1)):
        raise TagInputError(f"groups[{g}]", "its machines have no device with a positive batch share")
    weighted = np.where(active, shares[None, :], 0.0)
    group_share = weighted / weighted.sum(axis=1, keepdims=True)
    opt = np.array([_OPTION_CODE[o] for o in s.options])
    # Replicas of a split group (allreduce, ps) compute whole rows, as the emitted graph does: a device
    # whose share rounds to no row runs no replica, so it leaves the group.
    for g in np.flatnonzero(opt <= 1):
        devs = np.flatnonzero(active[g])
        rows = ctx.row_splits(s.masks[g], shares, devs)
        active[g, devs[rows == 0]] = False
        group_share[g, devs] = rows / ctx.batch
    g_of = s.op_groups
    op_opt = opt[g_of]
    kind = np.where(op_opt == 2, FULL, SPLIT).astype(np.int8)
    single = np.full(ctx.n, -1, dtype=np.int64)

    # Model parallel: the strategy's device per op, else contiguous chunks of the schedule.
    for g in np.flatnonzero(opt == 3):
        devs = np.flatnonzero(active[g])
        ops = ctx.order[g_of[ctx.order] == g]
        chosen = s.op_devices[ops] if s.op_devices is not None else np.full(len(ops), -1)
        missing = chosen < 0
        if missing.any():
            work = ctx.ref_time[ops]
            cum = np.cumsum(work) - work * 0.5
            chunk = np.minimum((cum / max(work.sum(), 1e-30) * len(devs)).astype(np.int64), len(devs) - 1)
            chosen = np.where(missing, devs[chunk], chosen)
        single[ops] = chosen
        kind[ops] = SINGLE

    # PS: each variable's update runs on one PS, round-robin over the group's devices (variables one op
    # takes together share theirs).
    for g in np.flatnonzero(opt == 1):
        devs = np.flatnonzero(active[g])
        ops = np.flatnonzero((g_of == g) & (ctx.apply_owner >= 0))
        if len(ops) == 0:
            continue
        _, rank = np.unique(ctx.ps_class[ctx.apply_owner[ops]], return_inverse=True)
        single[ops] = devs[rank % len(devs)]
        kind[ops] = SINGLE
    sfb_full = _sfb_placements(ctx, s, op_opt, kind, single)
    pl = np.where(kind == SINGLE, G + single, np.where(sfb_full, G + D + g_of, g_of))
    return Placement(kind=kind, pl=pl, group_active=active, group_share=group_share, single_dev=single)


_OPTION_CODE = {"allreduce": 0, "ps": 1, "duplicate": 2, "model_parallel": 3}


def _sfb_placements(ctx, s: Strategy, op_opt: np.ndarray, kind: np.ndarray, single: np.ndarray) -> np.ndarray:
    """Apply `s.sfb`: in AllReduce groups the ops run FULL on the group's devices (returned as a mask);
    in PS groups they run SINGLE on the variable's PS, which then needs no push."""
    full = np.zeros(ctx.n, dtype=bool)
    for name, ops in s.sfb.items():
        v = ctx.var_index.get(name, -1)
        if v < 0:
            raise TagInputError(f"sfb[{name!r}]", "names no variable of the graph")
        ops = np.asarray(ops, dtype=np.int64)
        ps_ops = np.flatnonzero((ctx.apply_owner == v) & (kind == SINGLE) & (op_opt == 1))
        ps_dev = int(single[ps_ops[0]]) if len(ps_ops) else -1
        on_ps = (op_opt[ops] == 1) & (ps_dev >= 0)
        single[ops[on_ps]] = ps_dev
        kind[ops[on_ps]] = SINGLE
        replicated = ops[~on_ps & np.isin(op_opt[ops], (0, 1))]
        kind[replicated] = FULL
        full[replicated] = True
    return full


def _placement_desc(ctx, p: Placement, s: Strategy, pl: int):
    """(kind, devices, batch intervals (lo, hi) per device, option) of placement id `pl`."""
    G, D = s.num_groups, ctx.num_devices
    if G <= pl < G + D:
        dev = pl - G
        return SINGLE, np.array([dev]), np.array([0.0]), np.array([1.0]), -1
    sfb = pl >= G + D
    g = pl - G - D if sfb else pl
    devs = np.flatnonzero(p.group_active[g])
    frac = p.group_share[g, devs]
    hi = np.cumsum(frac)
    lo = hi - frac
    hi[-1] = 1.0
    kind = FULL if sfb or s.options[g] == "duplicate" else SPLIT
    return kind, devs, lo, hi, _OPTION_CODE[s.options[g]]


def edge_transfers(ctx, p: Placement, s: Strategy, reduced_vars: np.ndarray,
                   pos: np.ndarray) -> tuple[Transfers, Collectives]:
    """The transfers and collectives (all-gathers, broadcasts) every edge needs under placement `p` (`pos`: each
    op's place in the strategy's execution order).

    An edge pattern depends only on (source placement, destination placement, batch flag,
    sync mode), so patterns are worked out once per distinct combination and stamped onto
    all edges that share it.
    """
    src_pl, dst_pl = p.pl[ctx.e_src], p.pl[ctx.e_dst]
    # Gradient edges: pushed to the PS when the update is SINGLE and the gradient is in a PS group,
    # otherwise the AllReduce (when there is one) hands every replica the reduced gradient.
    mode = np.zeros(len(ctx.e_src), dtype=np.int64)
    sync = ctx.e_sync_var >= 0
    if sync.any():
        var = ctx.e_sync_var
        reduced = sync & reduced_vars[np.maximum(var, 0)]
        mode[reduced] = REDUCED
        ps_src = (p.kind[ctx.e_src] == SPLIT) & (s.options_arr[s.op_groups[ctx.e_src]] == 1)
        mode[sync & ~reduced & ps_src & (p.kind[ctx.e_dst] == SINGLE)] = PUSH
    G, D = s.num_groups, ctx.num_devices
    P = 2 * G + D
    key = ((src_pl * P + dst_pl) * 2 + ctx.e_batch) * 3 + mode
    cross = src_pl != dst_pl
    if not cross.any() and not (mode == PUSH).any():
        return no_transfers(), no_collectives()
    kept = np.ones(len(key), dtype=bool)
    kept[_later_readers(ctx, key, pos)] = False
    kept = np.flatnonzero(kept)
    uniq, inverse = np.unique(key[kept], return_inverse=True)
    pieces, gathered, resharded = [], [], []
    by_key = np.split(kept[np.argsort(inverse, kind="stable")],
                      np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1])
    descs: dict[int, tuple] = {}
    desc = lambda pl: descs[pl] if pl in descs else descs.setdefault(pl, _placement_desc(ctx, p, s, pl))  # noqa: E731
    for u_i, u in enumerate(uniq.tolist()):
        m = u % 3
        b = (u // 3) % 2
        pair = u // 6
        sp, dp = divmod(pair, P)
        if sp == dp and m != PUSH:
            continue  # same placement: every replica reads its own producer
        edges = by_key[u_i]
        if G <= sp < G + D and G <= dp < G + D:  # one device to another (PS, model parallel): the common pair
            pieces.append((edges, np.array([[sp - G, dp - G, 1.0, P2P]])))
            continue
        src, dst = desc(sp), desc(dp)
        collective = _collective_shape(ctx, src, dst, bool(b), m)
        if collective is not None:
            # Tensors move by the collective; pure dependencies (no bytes) stay point-to-point signals.
            data = ctx.e_bytes[edges] > 0
            if data.any():
                gathered.append((edges[data], dp, *collective))
            edges = edges[~data]
            if not len(edges):
                continue
        if is_large(src, dst, bool(b), m):  # thousands of pieces: one unit per tensor (reshard.py)
            resharded.append(reshard_units(ctx, edges, src, dst))
            continue
        r = _pattern(ctx, src, dst, bool(b), m)  # (src_dev, dst_dev, frac, kind)
        if not len(r):
            continue
        if too_many_rows(r, m):  # thousands of pieces: one unit per tensor
            resharded.append(rows_units(ctx, edges, r))
            continue
        pieces.append((edges, r))
    colls = concat_collectives([_edge_collectives(ctx, gathered), *resharded])
    if not pieces:
        return no_transfers(), colls
    # A pattern's rows repeat for each of its edges, stamped by index (one edge per pattern is the rule for a
    # PS's pushes: millions of rows on thousands of GPUs, not copied; thousands of one-row patterns between
    # single devices are the rule for PS updates and model-parallel parts).
    n_rows, n_edges = [len(r) for _, r in pieces], [len(e) for e, _ in pieces]
    edges = np.concatenate([e for e, _ in pieces])
    per_edge = np.repeat(n_rows, n_edges)  # rows of each edge
    first_row = np.repeat(np.cumsum([0] + n_rows[:-1]), n_edges)
    rows = np.concatenate([r for _, r in pieces])
    del pieces
    # Each field is stamped straight into its final type, and the indices go as soon as they are used: the
    # stamped arrays have one element per transfer (millions for a PS on thousands of GPUs).
    src_rows, dst_rows, kind_rows = (rows[:, c].astype(np.int64) for c in (0, 1, 3))
    e_idx = np.repeat(edges, per_edge)
    row_idx = np.repeat(first_row - (np.cumsum(per_edge) - per_edge), per_edge)  # first row, less the edge's start
    row_idx += np.arange(len(e_idx))
    cons_op, src_op, nbytes = ctx.e_dst[e_idx], ctx.e_src[e_idx], ctx.e_bytes[e_idx]
    del e_idx
    nbytes *= rows[row_idx, 2]
    src_dev, dst_dev, kind = src_rows[row_idx], dst_rows[row_idx], kind_rows[row_idx]
    del row_idx
    return Transfers(cons_op=cons_op, cons_dev=dst_dev, src_op=src_op, src_dev=src_dev, nbytes=nbytes,
                     channel=ctx.dev_channel[src_dev, dst_dev], kind=kind), colls


def _later_readers(ctx, key: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Edges whose tensor an earlier consumer (in execution order) of the same pattern `key` receives already.

    The edges of one pattern lead to the same devices. TF sends a tensor (or a control signal) once to each
    device that consumes it, and a device runs its ops in execution order: its first consumer waits for the
    tensor, and the others come after that one (an Adam update's Sub and Square of one gradient on a PS: one
    push, not two). One sort over every edge whose tensor other edges carry too."""
    shared = np.flatnonzero(ctx.e_shared)
    if len(shared) < 2:
        return shared
    shared = shared[np.lexsort((pos[ctx.e_dst[shared]], ctx.e_tensor[shared], key[shared]))]
    tensor, pattern = ctx.e_tensor[shared], key[shared]
    return shared[1:][(tensor[1:] == tensor[:-1]) & (pattern[1:] == pattern[:-1])]


def _collective_shape(ctx, src, dst, batch: bool, mode: int):
    """(kind, devices, shares) when the move from `src` to `dst` is a collective, else None.

    All-gather: rows split over devices, wanted whole on each of the same devices.
    Broadcast: one device's tensor wanted whole on two or more others.
    """
    s_kind, s_devs, s_lo, s_hi, _ = src
    d_kind, d_devs, _, _, _ = dst
    if mode != NORMAL or len(d_devs) < 2 or not (d_kind != SPLIT or not batch):
        return None
    if s_kind == SPLIT and batch:
        if d_kind == FULL and len(s_devs) == len(d_devs) and np.array_equal(np.sort(s_devs), np.sort(d_devs)):
            return ALLGATHER, s_devs, s_hi - s_lo
        return None
    if len(s_devs) == 1 and (d_devs != s_devs[0]).sum() >= 2:
        return BROADCAST, devices_of(ctx, s_devs, d_devs), None
    return None


def _edge_collectives(ctx, gathered) -> Collectives:
    """One unit per (source tensor, destination placement) of each collective edge pattern."""
    parts = []
    for edges, dst_pl, kind, devs, shares in gathered:
        tensors, unit_of_edge = np.unique(ctx.e_src[edges], return_inverse=True)
        nbytes = np.zeros(len(tensors))
        np.maximum.at(nbytes, unit_of_edge, ctx.e_bytes[edges])
        order = np.argsort(devs, kind="stable")
        counts, intra, inter, channels = allreduce_shape(ctx, devs[order])
        if kind == ALLGATHER:
            duration = ctx.comm.allgather(nbytes, shares[order], counts, intra, inter)
        else:
            slowest = min([bw for bw, k in zip(intra, counts) if k > 1] + ([inter] if len(counts) > 1 else []))
            duration = ctx.comm.broadcast(nbytes, counts, slowest) + 0.0 * nbytes
        U = len(tensors)
        parts.append(Collectives(np.full(U, kind), nbytes, duration, [channels] * U, [devs] * U, tensors,
                                 np.arange(U), ctx.e_dst[edges], unit_of_edge))
    return concat_collectives(parts)


def _pattern(ctx, src, dst, batch: bool, mode: int) -> np.ndarray:
    """Rows (src_dev, dst_dev, fraction of the edge's bytes, kind) for one placement pair, destination-major.
    Vectorised: a pattern between placements of thousands of devices has as many rows."""
    s_kind, s_devs, s_lo, s_hi, _ = src
    d_kind, d_devs, d_lo, d_hi, _ = dst
    if mode == PUSH:
        d = np.repeat(d_devs, len(s_devs))
        p = np.tile(s_devs, len(d_devs))
        return _rows(p, d, np.ones(len(d)), PS_PUSH, p != d)
    split_dst = d_kind == SPLIT and batch
    lo, hi = (d_lo, d_hi) if split_dst else (np.zeros(len(d_devs)), np.ones(len(d_devs)))
    if s_kind == SPLIT and batch and mode != REDUCED:
        # Candidate source intervals per destination (widened: interval ends carry rounding), then the exact test.
        first = np.searchsorted(s_hi, lo - 1e-9, side="left")
        last = np.searchsorted(s_lo, hi + 1e-9, side="right")
        n = np.maximum(last - first, 0)
        i = np.repeat(np.arange(len(d_devs)), n)
        j = np.repeat(first, n) + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        overlap = np.minimum(hi[i], s_hi[j]) - np.maximum(lo[i], s_lo[j])
        p, d = s_devs[j], d_devs[i]
        return _rows(p, d, overlap, GATHER if d_kind != SPLIT else P2P, (overlap > 1e-12) & (p != d))
    # One-device sources and destinations (PS updates, model-parallel parts; one-device pairs never get here)
    # are the common case, and isin/unique cost more than the answer there.
    if len(s_devs) == 1:
        need = d_devs != s_devs[0]
    elif len(d_devs) == 1:  # a group's devices are sorted
        at = int(np.searchsorted(s_devs, d_devs[0]))
        need = np.array([at == len(s_devs) or s_devs[at] != d_devs[0]])
    else:
        need = ~np.isin(d_devs, s_devs)
    d = d_devs[need]
    if not len(d):
        return np.zeros((0, 4))
    if len(s_devs) == 1:
        best = np.full(len(d), s_devs[0])
    elif len(d) == 1:
        best = s_devs[[np.argmax(ctx.machine_bw[ctx.dev_machine[d[0]], ctx.dev_machine[s_devs]])]]
    else:  # the best-connected holder (first of the fastest), looked up per destination machine
        machines, inv = np.unique(ctx.dev_machine[d], return_inverse=True)
        best = s_devs[np.argmax(ctx.machine_bw[machines][:, ctx.dev_machine[s_devs]], axis=1)][inv.reshape(-1)]
    frac = (hi - lo)[need] if batch else np.ones(len(d))
    return _rows(best, d, frac, P2P, np.ones(len(d), dtype=bool))


def _rows(p: np.ndarray, d: np.ndarray, frac: np.ndarray, kind: int, keep: np.ndarray) -> np.ndarray:
    return np.column_stack([p[keep], d[keep], frac[keep], np.full(int(keep.sum()), kind)]).astype(np.float64)


def variable_pulls(ctx, p: Placement, s: Strategy) -> Transfers:
    """A variable updated on one device (its PS, or where model parallelism put its update) lives there, and
    the emitter runs every read of it there: each other device that reads it gets the value first."""
    home = np.full(ctx.num_vars, -1, dtype=np.int64)
    owned = np.flatnonzero((p.kind == SINGLE) & (ctx.apply_owner >= 0))
    home[ctx.apply_owner[owned[::-1]]] = p.single_dev[owned[::-1]]  # first op of each owner wins
    reads = ctx.param_reads
    reads = reads[home[ctx.op_var[reads]] >= 0]
    if len(reads) == 0:
        return no_transfers()
    src = home[ctx.op_var[reads]]
    members = p.group_active[s.op_groups[reads]]  # (r, D): the devices of each read's copies
    single = np.flatnonzero(p.kind[reads] == SINGLE)
    members[single] = False
    members[single, p.single_dev[reads[single]]] = True
    r_idx, dev = np.nonzero(members & (np.arange(ctx.num_devices)[None, :] != src[:, None]))
    if len(r_idx) == 0:
        return no_transfers()
    ops = reads[r_idx]
    kind = np.where(s.options_arr[s.op_groups[ops]] == 1, PS_PULL, P2P)
    return Transfers(cons_op=ops, cons_dev=dev, src_op=np.full(len(ops), -1), src_dev=src[r_idx],
                     nbytes=ctx.param_bytes[ops], channel=ctx.dev_channel[src[r_idx], dev], kind=kind)


def gradient_collectives(ctx, p: Placement, s: Strategy) -> tuple[Collectives, np.ndarray]:
    """AllReduce units (fused into buckets when fusion_bytes > 0), and which variables are reduced."""
    reduced = np.zeros(ctx.num_vars, dtype=bool)
    gops = ctx.sync_grad_op  # per sync variable (index into ctx.sync_vars)
    if len(gops) == 0:
        return no_collectives(), reduced
    g_of = s.op_groups[gops]
    n_act = p.group_active[g_of].sum(axis=1)
    opt = s.options_arr[g_of]
    split = p.kind[gops] == SPLIT
    # PS gradients with a SINGLE update are pushed instead; every other replicated gradient is reduced.
    push = (opt == 1) & ctx.sync_all_single(p.kind)
    chosen = split & (n_act > 1) & ~push
    reduced[ctx.sync_vars[chosen]] = True
    if not chosen.any():
        return no_collectives(), reduced
    idx = np.flatnonzero(chosen)
    idx = idx[np.argsort(ctx.pos[gops[idx]], kind="stable")]
    # Bucket boundaries: a new unit per gradient, or (fusion) when the bucket is full or the group changes.
    unit_of = np.empty(len(idx), dtype=np.int64)
    sizes = ctx.sync_bytes[idx].tolist()
    groups = g_of[idx].tolist()
    u, size = -1, 0.0
    for j in range(len(idx)):
        if u < 0 or groups[j] != groups[j - 1] or s.fusion_bytes <= 0 or size >= s.fusion_bytes:
            u, size = u + 1, 0.0
        unit_of[j] = u
        size += sizes[j]
    U = u + 1
    nbytes = np.bincount(unit_of, weights=ctx.sync_bytes[idx], minlength=U)
    first = np.flatnonzero(np.diff(unit_of, prepend=-1))
    durations, channels, devices = group_allreduces(ctx, p, g_of[idx][first], nbytes)
    var_unit = np.full(len(gops), -1, dtype=np.int64)
    var_unit[idx] = unit_of
    cons_unit = var_unit[ctx._sync_cons_owner]
    keep = cons_unit >= 0
    return Collectives(np.full(U, ALLREDUCE), nbytes, durations, channels, devices, gops[idx], unit_of,
                       ctx._sync_cons_flat[keep], cons_unit[keep]), reduced


def group_allreduces(ctx, p: Placement, unit_group: np.ndarray, nbytes: np.ndarray):
    """(durations, channels, devices) of all-reduce units: unit u over the devices of group unit_group[u],
    carrying nbytes[u]. Each group's ring is worked out once."""
    durations = np.empty(len(unit_group))
    per_group: dict[int, tuple] = {}
    for g in unit_group.tolist():
        if g not in per_group:
            devs = np.flatnonzero(p.group_active[g])
            counts, intra, inter, used = allreduce_shape(ctx, devs)
            mine = unit_group == g
            durations[mine] = ctx.comm.allreduce(nbytes[mine], counts, intra, inter, **tier_args(ctx, devs))
            per_group[g] = (used, devs)
    return durations, [per_group[g][0] for g in unit_group.tolist()], [per_group[g][1] for g in unit_group.tolist()]


def allreduce_shape(ctx, devs: np.ndarray):
    """Per-machine counts, intra bandwidths, ring bandwidth across machines, and channels used."""
    machines, counts = np.unique(ctx.dev_machine[devs], return_counts=True)
    intra = [float(ctx.machine_bw[m, m]) for m in machines.tolist()]
    channels = [int(m) for m, k in zip(machines.tolist(), counts.tolist()) if k > 1]
    inter = 1.0
    if len(machines) > 1:
        ring = list(zip(machines.tolist(), np.roll(machines, -1).tolist()))
        inter = min(float(ctx.machine_bw[a, b]) for a, b in ring)
        channels += sorted({int(ctx.dev_channel_m[a, b]) for a, b in ring})
    return counts.tolist(), intra, inter, tuple(channels)


def tier_args(ctx, devs: np.ndarray) -> dict:
    """On a topology with racks, the all-reduce's rings inside racks, across racks and pods, with shared
    uplinks (CommModel.allreduce_tiers); flat topologies keep the two-level ring."""
    if not getattr(ctx.topology, "racks", ()):
        return {}
    return {"tiers": ctx.comm.allreduce_tiers(ctx.topology, np.unique(ctx.dev_machine[devs]))}


def transfer_durations(ctx, t: Transfers, rows: slice = slice(None)) -> np.ndarray:
    channel = t.channel[rows]
    return ctx.channel_latency[channel] + t.nbytes[rows] / ctx.channel_bps[channel]
