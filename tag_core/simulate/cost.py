"""Cost model: compute time per op and device type, transfer and collective times, memory facts.

Compute time of an op on a device type at a batch size:

1. Measured: the median over profiled runs for that (op, device type, batch size) of the op's
   traced time plus, where the profile measured it, the executor's cost of running the op that
   traces leave out (`overhead_us`: dispatch per node it ran and its share of the nodes outside
   the OpGraph, tag_core.profile.profiler), scaled per batch so that the ops add up to the median
   run's step (`_step_factors`), each piecewise-linear over batch size, extrapolated
   linearly beyond the profiled batches. An op the profiled runtime did not run (fed, folded or
   fused) then costs nothing; profiles without the overhead (imported, older) are clamped at the
   device's per-kernel launch floor instead. Ops that do not scale with the batch (no input or output
   carries the batch dimension) take the median over every profiled batch size. With the overhead, the
   ops are then scaled to add up to the measured step at that batch (each op's own curve, summed): the
   overhead is the untraced step less the traced kernels, spread per node, and where tracing slowed the
   kernels it is negative and lands mostly on the many small batch-free ops, so their median over batches
   and the clamp at zero would move the step (a 1-layer transformer at batch 16: 15.5 ms against the
   17.9 ms its profile measured, at 32: 31.1 against 28.4; a split strategy's replicas run at 16).
2. Device types without a profile: a roofline ratio from a profiled type,
   t_target = t_source * max(flops/peak, bytes/bw)_target / max(flops/peak, bytes/bw)_source.
   How good it is: it keeps each op's measured shape (which ops dominate, how the op
   scales with the batch) but the absolute level is only as good as "peak FLOP/s and
   memory bandwidth predict speed", which they do to within about 2-3x per op between
   GPU generations and worse from CPU to GPU (GPUs reach a smaller share of peak on
   small kernels; CPU profiles carry TensorFlow executor overhead per op, which is why a
   launch floor is applied on the target). It is good for ranking strategies on one
   cluster, not for predicting wall-clock time on hardware nobody profiled.
3. No profile of the op at all: roofline from its flops and bytes on the target type,
   plus a per-kernel launch floor.

Communication: a transfer costs latency + bytes / bandwidth of the bottleneck link of its
path (one machine pair, or the intra-machine interconnect; across racks the uplinks, see
tag_core.cluster.hierarchy). Collectives follow the ring algorithms NCCL uses (formulas at
each function); on racks, `tiered_allreduce_time` goes level by level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tag_core.capture.graph import OpGraph
from tag_core.cluster.gpu_catalog import CATALOG, GpuType

LATENCY_S = 12e-6  # per point-to-point transfer and per ring step (TAG authors' figure)
GPU_LAUNCH_FLOOR_S = 4e-6  # shortest time a GPU kernel takes, launch included
CPU_LAUNCH_FLOOR_S = 1e-6  # TF executor's per-op floor on the host CPU
CPU_TYPE = "cpu"


def launch_floor(gpu: GpuType) -> float:
    return CPU_LAUNCH_FLOOR_S if gpu.name.lower() == CPU_TYPE else GPU_LAUNCH_FLOOR_S


def bytes_per_s(gbps: float) -> float:
    """Gbit/s (how links are quoted) to bytes/s."""
    return gbps * 1e9 / 8.0


# ---- communication ---------------------------------------------------------


def transfer_time(nbytes: float, gbps: float, latency: float = LATENCY_S) -> float:
    """Point-to-point: latency + bytes over the bottleneck link."""
    return latency + nbytes / bytes_per_s(gbps)


def ring_allreduce_time(nbytes: float, n: int, gbps: float, latency: float = LATENCY_S) -> float:
    """Ring AllReduce over n devices: 2(n-1)/n * bytes / slowest link, plus 2(n-1) latency steps."""
    if n <= 1:
        return 0.0 * nbytes
    return 2.0 * (n - 1) / n * nbytes / bytes_per_s(gbps) + 2 * (n - 1) * latency


def hierarchical_allreduce_time(nbytes, per_machine: list[int], intra_gbps: list[float], inter_gbps: float,
                                intra_latency: float = LATENCY_S, inter_latency: float = LATENCY_S):
    """Reduce-scatter inside each machine, ring AllReduce across machines, all-gather inside.

    Machines work in parallel, so the slowest machine sets each intra phase. With one
    machine it is the plain ring; with one device per machine the plain ring across machines.
    `nbytes` may be an array (one collective each).
    """
    machines = [(k, bw) for k, bw in zip(per_machine, intra_gbps) if k > 0]
    if not machines:
        return 0.0 * nbytes
    if len(machines) == 1:
        return ring_allreduce_time(nbytes, machines[0][0], machines[0][1], intra_latency)
    intra = 0.0 * nbytes
    for k, bw in machines:
        if k > 1:
            intra = np.maximum(intra, (k - 1) / k * nbytes / bytes_per_s(bw) + (k - 1) * intra_latency)
    return 2.0 * intra + ring_allreduce_time(nbytes, len(machines), inter_gbps, inter_latency)


@dataclass(frozen=True)
class RingTier:
    """One stage above the machine of a hierarchical all-reduce: a ring inside every unit of one level at once
    (the machines of each rack, the racks of each pod, or the pods). CommModel.allreduce_tiers builds them."""

    level: str  # "rack", "pod" or "cluster": the unit the rings run inside
    members: np.ndarray  # per unit: how many machines, racks or pods its ring joins
    seconds_per_byte: np.ndarray  # per unit: its slowest flow's seconds per byte of the whole tensor
    latency_s: float  # per ring step
    flows: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per unit: concurrent flows (for reports)


def tiered_allreduce_time(nbytes, per_machine: list[int], intra_gbps: list[float], tiers: tuple[RingTier, ...],
                          intra_latency: float = LATENCY_S):
    """Reduce-scatter up the levels, all-reduce at the top, all-gather down:

        T = 2 max_machine [(k-1)/k * B / intra + (k-1) l0] + sum over tiers 2 max_unit [(m-1)/m * B * s + (m-1) l]

    with k GPUs of a machine, m members of a unit and s its seconds per byte. The top tier's term is its
    ring all-reduce (reduce-scatter plus all-gather cost the same). A machine's GPUs share its NIC, so the
    rack tier moves all B per machine (s = 1 / ring bandwidth, as `hierarchical_allreduce_time`); above it
    each machine carries its shard (B / machines of its rack taking part, then / racks of its pod) on its
    contended uplink share. With one tier this is `hierarchical_allreduce_time`; `nbytes` may be an array.
    """
    intra = 0.0 * nbytes
    for k, bw in set(zip(per_machine, intra_gbps)):  # thousands of machines, a few kinds
        if k > 1:
            intra = np.maximum(intra, (k - 1) / k * nbytes / bytes_per_s(bw) + (k - 1) * intra_latency)
    total = 2.0 * intra
    for tier in tiers:
        ring = tier.members > 1
        if not ring.any():
            continue
        # Units with the same terms cost the same: a few distinct pairs however many racks.
        terms = np.unique(np.stack([(tier.members[ring] - 1) / tier.members[ring] * tier.seconds_per_byte[ring],
                                    (tier.members[ring] - 1) * tier.latency_s], axis=1), axis=0)
        slowest = 0.0 * nbytes
        for per_byte, steps in terms:
            slowest = np.maximum(slowest, per_byte * nbytes + steps)
        total = total + 2.0 * slowest
    return total


def broadcast_time(nbytes: float, n: int, gbps: float, latency: float = LATENCY_S) -> float:
    """Pipelined chain broadcast from one device to n-1 others: bytes / slowest link + (n-1) latencies."""
    if n <= 1:
        return 0.0
    return nbytes / bytes_per_s(gbps) + (n - 1) * latency


def allgather_time(total_bytes: float, n: int, gbps: float, latency: float = LATENCY_S) -> float:
    """Ring all-gather of a tensor split over n devices: (n-1)/n * total / slowest link + (n-1) latencies."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * total_bytes / bytes_per_s(gbps) + (n - 1) * latency


def hierarchical_allgather_time(total_bytes, shares: list[float], per_machine: list[int], intra_gbps: list[float],
                                inter_gbps: float, intra_latency: float = LATENCY_S, inter_latency: float = LATENCY_S):
    """All-gather of a tensor whose rows are split over devices in `shares` (fractions, one per device,
    listed machine by machine as `per_machine` counts them).

    Pieces are padded to the largest, as NCCL's all-gather needs equal counts. One machine: a ring.
    Several: a ring inside each machine, a ring of the machines' pieces across machines, then what
    came from other machines chained through each machine. Machines work in parallel.
    """
    pieces = _distinct_pieces(np.asarray(shares, dtype=np.float64), per_machine, intra_gbps)
    machines = sum(pieces.values())
    if machines == 1:
        (n, bw, largest_share, _), = pieces
        return allgather_time(total_bytes * largest_share * n, n, bw, intra_latency)
    inside = 0.0 * total_bytes
    spread = 0.0 * total_bytes
    for n, bw, largest_share, local_sum in pieces:  # machines alike cost alike: each distinct one once
        inside = np.maximum(inside, allgather_time(total_bytes * largest_share * n, n, bw, intra_latency))
        spread = np.maximum(spread, broadcast_time(total_bytes * (1.0 - local_sum), n, bw, intra_latency))
    largest = max(local_sum for _, _, _, local_sum in pieces)
    across = allgather_time(total_bytes * largest * machines, machines, inter_gbps, inter_latency)
    return inside + across + spread


def _distinct_pieces(shares: np.ndarray, per_machine: list[int], intra_gbps: list[float]) -> dict[tuple, int]:
    """{(devices, intra Gbit/s, largest share, summed share): machines} over the machines with devices. Each
    distinct row of shares is reduced once, as the one-machine slice it stands for (the same float sums),
    so thousands of machines cost a few numpy calls."""
    counts = np.asarray(per_machine, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    bws = np.asarray(intra_gbps, dtype=np.float64)
    out: dict[tuple, int] = {}
    for n in np.unique(counts[counts > 0]).tolist():
        mine = np.flatnonzero(counts == n)
        rows = np.column_stack([shares[starts[mine][:, None] + np.arange(n)[None, :]], bws[mine]])
        distinct, multiplicity = np.unique(rows, axis=0, return_counts=True)
        for row, k in zip(distinct, multiplicity.tolist()):
            local = np.ascontiguousarray(row[:n])
            key = (n, float(row[n]), float(local.max()), float(local.sum()))
            out[key] = out.get(key, 0) + k
    return out


def ps_time(nbytes: float, workers_per_link: dict[float, int]) -> float:
    """Push then pull of one tensor through a PS, on uncontended links otherwise.

    `workers_per_link` maps a link's Gbit/s to how many workers reach the PS through it; the
    transfers of one link queue behind each other, links run in parallel.
    """
    slowest = max((count * transfer_time(nbytes, gbps) for gbps, count in workers_per_link.items() if count), default=0.0)
    return 2.0 * slowest


# ---- compute ---------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    """Median profile times (seconds) of one device type: ops x batch grid."""

    batches: np.ndarray  # sorted profiled batch sizes
    times: np.ndarray  # (n_ops, n_batches), NaN where an op was not profiled at that batch
    measured: np.ndarray  # bool per op: profiled at any batch
    # (n_ops, n_batches): the executor's cost beyond the traced time; None when the profile has none
    overhead: np.ndarray | None = None


class ComputeModel:
    """Per-op compute time for any device type at any (fractional) batch size.

    Built once per graph and profile set; `times(gpu, batch)` is cached because the
    simulator asks for the same few (type, batch share) pairs thousands of times.
    """

    def __init__(self, graph: OpGraph, profiles: pd.DataFrame | None = None):
        self.graph = graph
        self.n = len(graph.ops)
        self.graph_batch = graph.batch_size
        self.flops = np.array([op.flops for op in graph.ops], dtype=np.float64)
        # An op's work grows with the batch when any input or output carries it (a weight
        # gradient reads batch tensors but writes a batch-free one).
        self.batch_scaled = np.array([op.batch_scaled for op in graph.ops], dtype=bool)
        # Bytes an op touches: what it reads (incoming edges) plus what it writes.
        touched = np.array([op.output_bytes for op in graph.ops], dtype=np.float64)
        if graph.edges:
            dst = np.array([e.dst for e in graph.edges])
            np.add.at(touched, dst, np.array([e.bytes for e in graph.edges], dtype=np.float64))
            batch_in = np.array([e.batch for e in graph.edges], dtype=bool)
            self.batch_scaled[dst[batch_in]] = True
        self.mem_bytes = touched
        self.tables: dict[str, _Table] = {}
        if profiles is not None and len(profiles):
            self._load(profiles)
        self._cache: dict[tuple[str, float], np.ndarray] = {}

    def _load(self, profiles: pd.DataFrame) -> None:
        frame = profiles[profiles["op"].isin(self.graph.index)]
        overhead = frame["overhead_us"] if "overhead_us" in frame else np.nan
        frame = frame.assign(overhead_us=pd.to_numeric(overhead, errors="coerce"))
        keys = ["device_type", "op", "batch_size"]
        medians = frame.groupby(keys, sort=True)[["time_us", "overhead_us"]].median().reset_index()
        medians[["time_us", "overhead_us"]] *= _step_factors(frame, medians)[:, None]
        for device_type, rows in medians.groupby("device_type", sort=True):
            batches = np.sort(rows["batch_size"].unique()).astype(np.float64)
            times = np.full((self.n, len(batches)), np.nan)
            op_idx = rows["op"].map(self.graph.index).to_numpy()
            b_idx = np.searchsorted(batches, rows["batch_size"].to_numpy(dtype=np.float64))
            times[op_idx, b_idx] = rows["time_us"].to_numpy() * 1e-6
            overhead = None
            if rows["overhead_us"].notna().any():  # the profiler measured it (tag_core.profile.profiler)
                overhead = np.full((self.n, len(batches)), np.nan)
                overhead[op_idx, b_idx] = rows["overhead_us"].to_numpy() * 1e-6
                # A batch measured without it (an imported CSV among measured ones) borrows its neighbour's.
                measured_at = ~np.isnan(overhead).all(axis=0)
                overhead[:, measured_at] = np.nan_to_num(overhead[:, measured_at], nan=0.0)
            self.tables[str(device_type).lower()] = _Table(batches, times, ~np.isnan(times).all(axis=1), overhead)

    @property
    def profiled_types(self) -> list[str]:
        return sorted(self.tables)

    def source_for(self, gpu: GpuType) -> str | None:
        """The profiled type used for `gpu`: its own, else the host CPU's, else the first profiled."""
        name = gpu.name.lower()
        if name in self.tables:
            return name
        if CPU_TYPE in self.tables:
            return CPU_TYPE
        return self.profiled_types[0] if self.tables else None

    def times(self, gpu: GpuType, batch: float) -> np.ndarray:
        """Seconds per op on `gpu` when the op processes `batch` samples. Read-only, cached."""
        key = (gpu.name.lower(), round(float(batch), 6))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        batch = key[1]  # from the key, not the caller's value: a table must not depend on who asked first
        result = self._roofline(gpu, batch) + launch_floor(gpu)
        source = self.source_for(gpu)
        if source is not None:
            table = self.tables[source]
            own = source == gpu.name.lower()
            # The executor overhead is the profiled runtime's; another device type gets the kernels only.
            measured = self._measured(table, batch, launch_floor(gpu) if own else 0.0, with_overhead=own)
            if not own:
                src_gpu = _catalog_lookup(source)
                ratio = self._roofline_ratio(gpu, src_gpu) if src_gpu is not None else 1.0
                measured = np.maximum(measured * ratio, launch_floor(gpu))
            result = np.where(table.measured, measured, result)
        result.flags.writeable = False
        self._cache[key] = result
        return result

    def _roofline(self, gpu: GpuType, batch: float) -> np.ndarray:
        scale = np.where(self.batch_scaled, batch / self.graph_batch, 1.0)
        return np.maximum(self.flops * scale / gpu.flops_per_s, self.mem_bytes * scale / gpu.mem_bw_bytes_per_s)

    def _roofline_ratio(self, target: GpuType, source: GpuType) -> np.ndarray:
        t = np.maximum(self.flops / target.flops_per_s, self.mem_bytes / target.mem_bw_bytes_per_s)
        s = np.maximum(self.flops / source.flops_per_s, self.mem_bytes / source.mem_bw_bytes_per_s)
        # Ops that neither compute nor move data scale with the peak ratio.
        fallback = source.flops_per_s / target.flops_per_s
        return np.where(s > 0, t / np.where(s > 0, s, 1.0), fallback)

    def _measured(self, table: _Table, batch: float, floor: float, with_overhead: bool = False) -> np.ndarray:
        """Each op's profile at `batch`: kernel time, plus the executor overhead when asked and measured (then
        no floor: an op the runtime did not run costs nothing); else clamped at `floor`."""
        kernel = self._interpolate(table, table.times, batch)
        if with_overhead and table.overhead is not None:
            overhead = self._interpolate(table, table.overhead, batch, per_sample=False)
            ops = np.maximum(kernel + overhead, 0.0)
            # The measured step: each op's own curve, neither clamped nor smoothed over batches.
            step = (self._interpolate(table, table.times, batch, smooth=False)
                    + self._interpolate(table, table.overhead, batch, per_sample=False, smooth=False))
            step, total = step[table.measured].sum(), ops[table.measured].sum()
            return ops * (step / total) if step > 0 and total > 0 else ops
        return np.maximum(kernel, floor)

    def _interpolate(self, table: _Table, times: np.ndarray, batch: float, per_sample: bool = True,
                     smooth: bool = True) -> np.ndarray:
        """Interpolate each op's row at `batch`; non-batch ops take their median over batches (`smooth`). From
        one profiled batch, times scale with the batch (`per_sample`) or stay as they are (per-node costs)."""
        batches = table.batches
        filled = _fill_rows(times)
        if len(batches) == 1:
            scaled = filled[:, 0] * (batch / batches[0] if per_sample else 1.0)
        else:
            k = int(np.clip(np.searchsorted(batches, batch) - 1, 0, len(batches) - 2))
            b0, b1 = batches[k], batches[k + 1]
            w = (batch - b0) / (b1 - b0)  # outside [b0, b1] this extrapolates linearly
            scaled = filled[:, k] + w * (filled[:, k + 1] - filled[:, k])
        if not smooth:
            constant = filled[:, 0] if len(batches) == 1 else scaled
        elif times.shape[1] > 1:  # unprofiled rows are all NaN; they are replaced by the caller
            with np.errstate(all="ignore"):
                constant = np.nanmedian(np.where(table.measured[:, None], times, 0.0), axis=1)
        else:
            constant = filled[:, 0]
        out = np.where(self.batch_scaled, scaled, constant)
        return np.nan_to_num(out, nan=0.0)


def _step_factors(frame: pd.DataFrame, medians: pd.DataFrame) -> np.ndarray:
    """Per row of `medians`: the median over runs of the step's total (all ops of one run, kernel plus
    overhead) over the sum of the ops' medians, at that row's device type and batch. Per-op times are
    skewed to the right (a hiccup slows a few ops of a run), so the sum of their medians falls short of
    the median step by 1-5% (measured on the zoo's CPU profiles); scaled, they add up to it again."""
    if "run" not in frame:
        return np.ones(len(medians))
    by_batch = ["device_type", "batch_size"]
    runs = profiled_steps(frame)
    summed = (medians["time_us"] + medians["overhead_us"].fillna(0.0)).groupby([medians[k] for k in by_batch]).sum()
    factor = (runs / summed).where(summed > 0).fillna(1.0)
    index = pd.MultiIndex.from_frame(medians[by_batch])
    return factor.reindex(index).fillna(1.0).to_numpy(dtype=np.float64)


def profiled_steps(frame: pd.DataFrame) -> pd.Series:
    """Per (device type, batch size) of a profile's rows: the median over its runs of the run's ops added up,
    kernel and overhead (µs)."""
    total = frame["time_us"] + (frame["overhead_us"].fillna(0.0) if "overhead_us" in frame else 0.0)
    keys = [frame[k] for k in ("device_type", "batch_size", "run")]
    return total.groupby(keys).sum().groupby(level=["device_type", "batch_size"]).median()


def _fill_rows(times: np.ndarray) -> np.ndarray:
    """Fill NaN gaps of each op's batch curve from its nearest measured neighbour."""
    if not np.isnan(times).any():
        return times
    out = times.copy()
    for j in range(1, out.shape[1]):
        out[:, j] = np.where(np.isnan(out[:, j]), out[:, j - 1], out[:, j])
    for j in range(out.shape[1] - 2, -1, -1):
        out[:, j] = np.where(np.isnan(out[:, j]), out[:, j + 1], out[:, j])
    return out


def _catalog_lookup(name: str) -> GpuType | None:
    lowered = {k.lower(): v for k, v in CATALOG.items()}
    return lowered.get(name.lower())


# ---- memory ----------------------------------------------------------------


def activation_bytes(graph: OpGraph) -> np.ndarray:
    """Bytes each op's output occupies while alive, at the graph's batch size.

    Variable reads alias the variable (TF hands out the buffer), so they add nothing.
    """
    return np.array(
        [0 if op.type == "ReadVariableOp" else op.output_bytes for op in graph.ops], dtype=np.float64
    )


def variable_bytes(graph: OpGraph) -> np.ndarray:
    return np.array([v.bytes for v in graph.variables], dtype=np.float64)
