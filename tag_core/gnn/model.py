"""Heterogeneous GAT over the joint op-group + machine graph, scoring every MCTS action.

Each layer, for every relation r (src type -> dst type), runs a GAT head set whose
attention logits use the source node, the destination node and the edge's features:
    z_e = W_s^r h_u + W_e^r x_e
    a_e = softmax over v's incoming r-edges of LeakyReLU(<q_s^r, W_s^r h_u> + <q_d^r, W_d^r h_v> + <q_e^r, W_e^r x_e>)
    m_v^r = sum_e a_e z_e                       (per head, heads concatenated)
and a node's update averages its relations' messages: h_v <- LayerNorm(h_v + ELU(W_o [mean_r m_v^r])).
The residual keeps every node's own features when it has no incoming edges (a single
machine has no links). Edge features enter every layer from the raw input, through
per-layer projections.

Output: for the group being decided, one logit per action (mask, option), from
[its node embedding, mean op embedding, mean embedding of the mask's machines,
mean machine embedding, the action's own features]; log-softmax over the actions.
No weight depends on the number of machines, groups or actions, so one network
serves any model on any cluster.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .compat import dgl, edge_softmax, fn
from .features import ETYPES, GraphSample, feature_dims


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 64
    heads: int = 4
    layers: int = 3
    action_hidden: int = 128

    def to_dict(self) -> dict:
        return asdict(self)


class EdgeGATLayer(nn.Module):
    """One heterogeneous layer: per-relation attention with edge features, residual + LayerNorm."""

    def __init__(self, hidden: int, heads: int, edge_dims: dict[str, int]):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.heads, self.head_dim = heads, hidden // heads
        self.src = nn.ModuleDict({r: nn.Linear(hidden, hidden, bias=False) for _, r, _ in ETYPES})
        self.dst = nn.ModuleDict({r: nn.Linear(hidden, hidden, bias=False) for _, r, _ in ETYPES})
        self.edge = nn.ModuleDict({r: nn.Linear(edge_dims[r], hidden) for _, r, _ in ETYPES})
        self.attn = nn.ParameterDict({r: nn.Parameter(torch.randn(3, heads, self.head_dim) * 0.1) for _, r, _ in ETYPES})
        ntypes = sorted({t for s, _, d in ETYPES for t in (s, d)})
        self.out = nn.ModuleDict({t: nn.Linear(hidden, hidden) for t in ntypes})
        self.norm = nn.ModuleDict({t: nn.LayerNorm(hidden) for t in ntypes})

    def forward(self, g, h: dict[str, torch.Tensor], e: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        H, Dh = self.heads, self.head_dim
        total = {t: torch.zeros_like(x) for t, x in h.items()}
        relations = {t: 0 for t in h}
        for s, r, d in ETYPES:
            sub = g[s, r, d]
            if sub.num_edges() == 0:
                continue
            fs = self.src[r](h[s]).view(-1, H, Dh)
            fd = self.dst[r](h[d]).view(-1, H, Dh)
            fe = self.edge[r](e[r]).view(-1, H, Dh)
            q = self.attn[r]
            with sub.local_scope():
                sub.srcdata["fs"] = fs
                sub.srcdata["ls"] = (fs * q[0]).sum(-1, keepdim=True)
                sub.dstdata["ld"] = (fd * q[1]).sum(-1, keepdim=True)
                sub.edata["fe"] = fe
                sub.apply_edges(fn.u_add_v("ls", "ld", "logit"))
                logit = F.leaky_relu(sub.edata["logit"] + (fe * q[2]).sum(-1, keepdim=True), 0.2)
                sub.edata["a"] = edge_softmax(sub, logit)
                sub.apply_edges(fn.u_add_e("fs", "fe", "z"))
                sub.edata["m"] = sub.edata["z"] * sub.edata["a"]
                sub.update_all(fn.copy_e("m", "m"), fn.sum("m", "agg"))
                total[d] = total[d] + sub.dstdata["agg"].reshape(-1, H * Dh)
            relations[d] += 1
        return {t: self.norm[t](x + F.elu(self.out[t](total[t] / max(relations[t], 1)))) for t, x in h.items()}


class PolicyNet(nn.Module):
    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        self.config = config or ModelConfig()
        c, dims = self.config, feature_dims()
        self.embed = nn.ModuleDict({"op": nn.Linear(dims["op"], c.hidden), "dev": nn.Linear(dims["dev"], c.hidden)})
        edge_dims = {r: dims[f"edge_{r}"] for _, r, _ in ETYPES}
        self.layers = nn.ModuleList(EdgeGATLayer(c.hidden, c.heads, edge_dims) for _ in range(c.layers))
        self.score = nn.Sequential(
            nn.Linear(4 * c.hidden + dims["action"], c.action_hidden), nn.ELU(),
            nn.Linear(c.action_hidden, c.action_hidden), nn.ELU(), nn.Linear(c.action_hidden, 1),
        )

    def forward(self, batch: "Batch") -> torch.Tensor:
        """Log-probabilities over each sample's actions, concatenated (use `batch.action_sample` to split)."""
        h = {t: F.elu(self.embed[t](x)) for t, x in batch.node_x.items()}
        for layer in self.layers:
            h = layer(batch.graph, h, batch.edge_x)
        op_mean = _segment_mean(h["op"], batch.op_sample, batch.size)
        dev_mean = _segment_mean(h["dev"], batch.dev_sample, batch.size)
        a = batch.action_sample
        mask_mean = batch.mask_pool @ h["dev"]  # (actions, hidden): mean over the mask's machines
        x = torch.cat([h["op"][batch.deciding][a], op_mean[a], mask_mean, dev_mean[a], batch.action_x], dim=1)
        logits = self.score(x).squeeze(1)
        return segment_log_softmax(logits, a, batch.size)


def _segment_mean(x: torch.Tensor, segment: torch.Tensor, segments: int) -> torch.Tensor:
    total = torch.zeros(segments, x.shape[1]).index_add_(0, segment, x)
    count = torch.zeros(segments).index_add_(0, segment, torch.ones(len(segment)))
    return total / count.clamp(min=1.0)[:, None]


def segment_log_softmax(logits: torch.Tensor, segment: torch.Tensor, segments: int) -> torch.Tensor:
    peak = torch.full((segments,), -torch.inf).scatter_reduce(0, segment, logits, "amax", include_self=True)
    shifted = logits - peak[segment]
    norm = torch.zeros(segments).index_add_(0, segment, shifted.exp()).log()
    return shifted - norm[segment]


@dataclass
class Batch:
    """Samples joined into one DGL heterograph, with the indices that map actions back to samples."""

    graph: object
    node_x: dict[str, torch.Tensor]
    edge_x: dict[str, torch.Tensor]
    action_x: torch.Tensor
    action_sample: torch.Tensor  # sample of each action
    mask_pool: torch.Tensor  # (actions, all machines) mean-pooling weights
    deciding: torch.Tensor  # global op-node index of each sample's deciding group
    op_sample: torch.Tensor
    dev_sample: torch.Tensor
    size: int
    action_counts: list[int]


def collate(samples: list[GraphSample]) -> Batch:
    ops = np.cumsum([0] + [s.num_ops for s in samples])
    devs = np.cumsum([0] + [s.num_devs for s in samples])
    offsets = {"op": ops, "dev": devs}
    data = {}
    for s_type, r, d_type in ETYPES:
        src = np.concatenate([s.edges[r][0] + offsets[s_type][i] for i, s in enumerate(samples)])
        dst = np.concatenate([s.edges[r][1] + offsets[d_type][i] for i, s in enumerate(samples)])
        data[(s_type, r, d_type)] = (torch.from_numpy(src.astype(np.int64)), torch.from_numpy(dst.astype(np.int64)))
    graph = dgl.heterograph(data, num_nodes_dict={"op": int(ops[-1]), "dev": int(devs[-1])})
    counts = [len(s.action_x) for s in samples]
    pool = np.zeros((sum(counts), int(devs[-1])), dtype=np.float32)
    row = 0
    for i, s in enumerate(samples):
        m = s.action_mask.astype(np.float32)
        pool[row:row + len(m), devs[i]:devs[i + 1]] = m / np.maximum(m.sum(1, keepdims=True), 1.0)
        row += len(m)
    cat = lambda arrays: torch.from_numpy(np.concatenate(arrays).astype(np.float32))  # noqa: E731
    return Batch(
        graph=graph,
        node_x={"op": cat([s.op_x for s in samples]), "dev": cat([s.dev_x for s in samples])},
        edge_x={r: cat([s.edge_x[r] for s in samples]) for _, r, _ in ETYPES},
        action_x=cat([s.action_x for s in samples]),
        action_sample=torch.from_numpy(np.repeat(np.arange(len(samples)), counts)),
        mask_pool=torch.from_numpy(pool),
        deciding=torch.tensor([int(ops[i]) + s.deciding for i, s in enumerate(samples)], dtype=torch.int64),
        op_sample=torch.from_numpy(np.repeat(np.arange(len(samples)), [s.num_ops for s in samples])),
        dev_sample=torch.from_numpy(np.repeat(np.arange(len(samples)), [s.num_devs for s in samples])),
        size=len(samples),
        action_counts=counts,
    )
