"""Featurizer: (op groups, topology, current strategy, its SimResult) -> one heterogeneous graph.

Nodes: one per op group ("op") and one per device group = machine ("dev").
Edges (all carry features):
  op -feeds-> op, op -fed_by-> op   tensor bytes between groups, both directions;
  dev -link-> dev                   the bandwidth between two machines;
  op -runs_on-> dev, dev -hosts-> op  the group's compute time on the machine's GPU type
                                    and whether the group is placed there.
Actions (what the network scores): every (placement mask, option) of the MCTS action space.

Normalisation, so that one network serves any graph size and any hardware speed:
times are shares of a total (x number of groups) or ratios of two times on the same
hardware; bytes become times over the cluster's own links, divided by compute times;
memory is a ratio to device memory; bandwidths are ratios to the cluster's fastest
link. Heavy-tailed ratios go through log1p and everything is clipped to +-CLIP.

`ProblemFeatures` holds what depends on the search problem only (graph, groups,
topology, action masks, strategy-wide settings) and is built once per evaluator;
`ProblemFeatures.sample(...)` adds the state: current actions, decided groups, and the
simulator's feedback (makespan and idle-after per group; utilisation, peak-memory ratio
and out-of-memory per device). Bump FEATURE_VERSION whenever any of this changes:
checkpoints record it and are refused under another version.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tag_core.simulate.result import SimResult
from tag_core.simulate.strategy import OPTIONS

FEATURE_VERSION = 1
CLIP = 10.0
BATCH_FRACTIONS = (1.0, 1 / 4, 1 / 16)  # of the global batch: compute time is profiled per op at these
NUM_OPTIONS = len(OPTIONS)

GLOBAL_FEATURES = ("time_vs_default", "oom", "depth", "devices_log", "overlap", "fusion",
                   "model_memory_vs_cluster", "model_memory_vs_device")
OP_FEATURES = (
    "time_share_b1", "time_share_b4", "time_share_b16", "batch_overhead_b4", "batch_overhead_b16",
    "param_share", "sync_over_compute_slow", "sync_over_compute_fast", "activation_memory", "position",
    *(f"option_{o}" for o in OPTIONS), "mask_devices", "mask_speed", "decided", "deciding",
    "makespan", "idle_after", *GLOBAL_FEATURES,
)
DEV_FEATURES = (
    "gpus", "gpus_log", "flops", "mem_bw", "memory_vs_model", "intra_bandwidth", "speed_share", "batch_share",
    "utilisation", "peak_memory", "oom", "in_deciding_mask", *GLOBAL_FEATURES,
)
_OP_OP = ("bytes_over_slowest", "bytes_over_fastest", "batch_bytes", "coplaced")
_OP_DEV = ("slowdown", "memory", "placed")
EDGE_FEATURES: dict[str, tuple[str, ...]] = {
    "feeds": _OP_OP, "fed_by": _OP_OP, "link": ("bandwidth", "model_sync", "same_type"),
    "runs_on": _OP_DEV, "hosts": _OP_DEV,
}
ETYPES: tuple[tuple[str, str, str], ...] = (
    ("op", "feeds", "op"), ("op", "fed_by", "op"), ("dev", "link", "dev"), ("op", "runs_on", "dev"), ("dev", "hosts", "op"),
)
ACTION_FEATURES = ("devices", "speed", "machines", "min_bandwidth", "sync_cost", "mixed_types", "memory_vs_model",
                   "is_current_mask", "is_current_action", *(f"option_{o}" for o in OPTIONS))


def schema() -> dict:
    """What a checkpoint must have been trained on (stored in it, compared on load)."""
    return {"version": FEATURE_VERSION, "op": list(OP_FEATURES), "dev": list(DEV_FEATURES),
            "edges": {k: list(v) for k, v in EDGE_FEATURES.items()}, "action": list(ACTION_FEATURES),
            "etypes": [list(e) for e in ETYPES]}


@dataclass
class GraphSample:
    """One state as plain arrays (graph structure, features, the actions to score)."""

    num_ops: int
    num_devs: int
    edges: dict[str, tuple[np.ndarray, np.ndarray]]  # relation -> (src, dst) node indices
    op_x: np.ndarray  # (G, len(OP_FEATURES)) float32
    dev_x: np.ndarray  # (M, len(DEV_FEATURES))
    edge_x: dict[str, np.ndarray]  # relation -> (E, len(EDGE_FEATURES[relation]))
    action_x: np.ndarray  # (K, len(ACTION_FEATURES))
    action_mask: np.ndarray  # (K, M) bool: machines each action places on
    deciding: int  # the op group whose action is scored


def _log_ratio(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    return np.log(np.maximum(a, 1e-15) / np.maximum(b, 1e-15))


def _clip(x: np.ndarray) -> np.ndarray:
    return np.clip(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=CLIP, neginf=-CLIP),
                   -CLIP, CLIP).astype(np.float32)


class ProblemFeatures:
    """Static features of one search problem: an `Evaluator` (simulator, groups, action space, settings)."""

    def __init__(self, evaluator):
        ev = evaluator
        sim, groups, space = ev.sim, ev.groups, ev.space
        topo = sim.topology
        self.evaluator = ev
        self.G, self.M, self.D = groups.num_groups, topo.num_machines, topo.num_devices
        self.space_size = space.size
        assign = groups.assignment
        G, M, D = self.G, self.M, self.D
        machine_gpu = [m.gpu for m in topo.machines]
        ref = max(machine_gpu, key=lambda g: (g.flops_per_s, g.name))  # fastest type: the reference device
        B = float(sim.batch)
        per_device = B / D

        def group_time(gpu, batch: float) -> np.ndarray:
            return np.bincount(assign, weights=sim.compute.times(gpu, batch), minlength=G)

        t_frac = np.stack([group_time(ref, B * f) for f in BATCH_FRACTIONS], axis=1)  # (G, F)
        t_dev = group_time(ref, per_device)  # each group at a per-device share of the batch
        self.step_dev_s = float(t_dev.sum())
        by_type = {g.name: group_time(g, per_device) for g in machine_gpu}

        # Model variables per group (each counted once per group that touches it) and activations.
        model_var = np.array([v.owner == "model" for v in sim.graph.variables], dtype=bool)
        has = np.flatnonzero(sim.op_var >= 0)
        pairs = np.unique(np.stack([assign[has], sim.op_var[has]], axis=1), axis=0) if len(has) else np.zeros((0, 2), int)
        keep = model_var[pairs[:, 1]] if len(pairs) else np.zeros(0, bool)
        params = np.bincount(pairs[keep, 0], weights=sim.var_bytes[pairs[keep, 1]], minlength=G) if len(pairs) else np.zeros(G)
        acts = np.bincount(assign, weights=sim.act_bytes, minlength=G)
        self.model_bytes = float(sim.var_bytes.sum() + sim.act_bytes.sum() / D)  # per device, data-parallel
        capacity = np.array([g.mem_bytes for g in machine_gpu], dtype=float)

        bw = np.asarray(topo.machine_bandwidth_matrix(), dtype=float)  # Gbit/s, diagonal intra
        bw_bytes = bw * 1e9 / 8
        slow, fast = float(bw_bytes.min()), float(bw_bytes.max())
        total_params = max(float(params.sum()), 1.0)

        self.op_static = np.stack([
            *(_log_ratio(G * t_frac[:, i], t_frac[:, i].sum()) for i in range(len(BATCH_FRACTIONS))),
            *(_log_ratio(t_frac[:, i], f * t_frac[:, 0]) for i, f in enumerate(BATCH_FRACTIONS) if i),
            np.log1p(G * params / total_params),
            np.log1p(2 * params / slow / np.maximum(t_dev, 1e-9)),
            np.log1p(2 * params / fast / np.maximum(t_dev, 1e-9)),
            np.log1p(G * acts / capacity.mean()),
            np.arange(G) / max(G - 1, 1),
        ], axis=1)

        # Machines.
        self.machine_of_device = np.asarray(topo.device_machine)
        counts = np.array([m.count for m in topo.machines], dtype=float)
        speed = np.bincount(self.machine_of_device, weights=ev.speed, minlength=M)
        self.speed_share = speed / max(speed.sum(), 1e-15)
        shares = np.bincount(self.machine_of_device, weights=ev.shares, minlength=M)
        flops = np.array([g.flops_per_s for g in machine_gpu])
        membw = np.array([g.mem_bw_bytes_per_s for g in machine_gpu])
        self.dev_static = np.stack([
            counts / D, np.log1p(counts) / np.log(9.0), flops / flops.max(), membw / membw.max(),
            _log_ratio(capacity, self.model_bytes), np.diag(bw) / bw.max(), self.speed_share,
            shares / max(shares.sum(), 1e-15),
        ], axis=1)
        self.capacity_per_device = np.array([d.gpu.mem_bytes for d in topo.devices], dtype=float)

        # op -> op: summed tensor bytes between two groups, as transfer time over compute time.
        gs, gd = assign[sim.e_src], assign[sim.e_dst]
        cross = gs != gd
        key = gs[cross] * G + gd[cross]
        uniq, inv = np.unique(key, return_inverse=True)
        nbytes = np.bincount(inv, weights=sim.e_bytes[cross], minlength=len(uniq))
        batch_bytes = np.bincount(inv, weights=sim.e_bytes[cross] * (sim.e_batch[cross] > 0), minlength=len(uniq))
        src, dst = uniq // G, uniq % G
        mean_dev = max(self.step_dev_s / G, 1e-9)
        oo = np.stack([np.log1p(nbytes / slow / mean_dev), np.log1p(nbytes / fast / mean_dev),
                       batch_bytes / np.maximum(nbytes, 1.0)], axis=1)
        # dev -> dev: every ordered pair of machines.
        la, lb = [a.ravel() for a in np.meshgrid(np.arange(M), np.arange(M), indexing="ij")]
        off = la != lb
        la, lb = la[off], lb[off]
        types = np.array([g.name for g in machine_gpu])
        link = np.stack([bw[la, lb] / bw.max(),
                         np.log1p(2 * total_params / bw_bytes[la, lb] / max(self.step_dev_s, 1e-9)),
                         (types[la] == types[lb]).astype(float)], axis=1)
        # op <-> dev: every (group, machine) pair.
        og, om = [a.ravel() for a in np.meshgrid(np.arange(G), np.arange(M), indexing="ij")]
        slowdown = np.stack([by_type[g.name] for g in machine_gpu], axis=1)  # (G, M)
        od = np.stack([_log_ratio(slowdown[og, om], t_dev[og]),
                       np.log1p(G * (params[og] + acts[og] / D) / capacity[om])], axis=1)
        self.edges = {"feeds": (src, dst), "fed_by": (dst, src), "link": (la, lb), "runs_on": (og, om), "hosts": (om, og)}
        self.edge_static = {"feeds": oo, "fed_by": oo, "link": link, "runs_on": od, "hosts": od}

        # Actions: placement masks (the option is appended per action).
        masks = np.asarray(space.masks, dtype=bool)
        self.masks = masks
        n_dev = masks @ counts
        inside = [bw[np.ix_(np.flatnonzero(m), np.flatnonzero(m))] for m in masks]
        min_bw = np.array([x.min() if len(x) > 1 else x.max() for x in inside]) * 1e9 / 8
        mask_cap = masks @ (capacity * counts)
        self.mask_static = np.stack([
            n_dev / D, masks @ self.speed_share, masks.sum(1) / M, min_bw / fast,
            np.log1p(2 * total_params / min_bw / max(self.step_dev_s, 1e-9)),
            np.array([len(set(types[m])) > 1 for m in masks], dtype=float),
            _log_ratio(mask_cap, self.model_bytes),
        ], axis=1)
        self.mask_devices = n_dev / D
        self.mask_speed = masks @ self.speed_share
        self.globals_static = np.array([np.log(D) / np.log(64.0), float(ev.overlap), float(ev.fusion_bytes > 0),
                                        _log_ratio(self.model_bytes * D, capacity @ counts),
                                        _log_ratio(self.model_bytes, capacity.min())])
        default = np.full(G, space.all_machines, dtype=np.int64)
        self.default_time_s = float(ev.score(default).time_s)

    # ---- one state -------------------------------------------------------------

    def sample(self, actions: np.ndarray, decided_groups, deciding: int, result: SimResult) -> GraphSample:
        """The graph of a search state: `actions` per group as scored, `decided_groups` decided."""
        actions = np.asarray(actions, dtype=np.int64)
        decided_groups = np.asarray(decided_groups, dtype=np.int64)
        depth = len(decided_groups)
        if self.evaluator.space.size != self.space_size:
            raise ValueError("the action space grew after the features were built")
        G, M = self.G, self.M
        k = NUM_OPTIONS
        mask_idx, option = actions // k, actions % k
        placed = self.masks[mask_idx]  # (G, M)
        T = max(float(result.iteration_time_s), 1e-12)
        glob = np.concatenate([[np.clip(_log_ratio(T, self.default_time_s), -3, 3), float(result.oom),
                                depth / max(G, 1)], self.globals_static])
        decided = np.zeros(G)
        decided[decided_groups] = 1.0
        deciding_flag = (np.arange(G) == deciding).astype(float)
        op_dyn = np.concatenate([
            np.eye(k)[option], self.mask_devices[mask_idx][:, None], self.mask_speed[mask_idx][:, None],
            decided[:, None], deciding_flag[:, None],
            (np.asarray(result.group_makespan_s, dtype=float) / T)[:, None],
            np.log1p(np.asarray(result.group_idle_after_s, dtype=float) / T)[:, None],
        ], axis=1)
        op_x = np.concatenate([self.op_static, op_dyn, np.tile(glob, (G, 1))], axis=1)

        mod = self.machine_of_device
        busy = np.bincount(mod, weights=np.asarray(result.busy_s, dtype=float), minlength=M)
        per_machine = np.maximum(np.bincount(mod, minlength=M), 1)
        peak = np.zeros(M)
        np.maximum.at(peak, mod, np.asarray(result.peak_memory_bytes, dtype=float) / self.capacity_per_device)
        oom = np.zeros(M)
        np.maximum.at(oom, mod, np.asarray(result.device_oom, dtype=float))
        in_mask = placed[deciding].astype(float) if 0 <= deciding < G else np.zeros(M)
        dev_dyn = np.stack([busy / per_machine / T, np.minimum(peak, 4.0), oom, in_mask], axis=1)
        dev_x = np.concatenate([self.dev_static, dev_dyn, np.tile(glob, (M, 1))], axis=1)

        src, dst = self.edges["feeds"]
        coplaced = (placed[src] == placed[dst]).all(1) & (option[src] == option[dst])
        og, om = self.edges["runs_on"]
        on = placed[og, om].astype(float)[:, None]
        edge_x = {
            "feeds": np.concatenate([self.edge_static["feeds"], coplaced[:, None]], axis=1),
            "fed_by": np.concatenate([self.edge_static["fed_by"], coplaced[:, None]], axis=1),
            "link": self.edge_static["link"],
            "runs_on": np.concatenate([self.edge_static["runs_on"], on], axis=1),
            "hosts": np.concatenate([self.edge_static["hosts"], on], axis=1),
        }
        K = len(self.masks) * k
        a_mask, a_opt = np.arange(K) // k, np.arange(K) % k
        current = int(actions[deciding]) if 0 <= deciding < G else -1
        action_x = np.concatenate([
            self.mask_static[a_mask], (a_mask == current // k)[:, None] if current >= 0 else np.zeros((K, 1)),
            (np.arange(K) == current)[:, None], np.eye(k)[a_opt],
        ], axis=1)
        return GraphSample(
            num_ops=G, num_devs=M, edges=self.edges, op_x=_clip(op_x), dev_x=_clip(dev_x),
            edge_x={r: _clip(x) for r, x in edge_x.items()}, action_x=_clip(action_x),
            action_mask=self.masks[a_mask], deciding=int(deciding),
        )


def feature_dims() -> dict[str, int]:
    return {"op": len(OP_FEATURES), "dev": len(DEV_FEATURES), "action": len(ACTION_FEATURES),
            **{f"edge_{r}": len(v) for r, v in EDGE_FEATURES.items()}}
