"""GNN featurizer, network, checkpoints and the prior hook, on small hand-built problems."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch
from gnn_helpers import machines, problem, source

from tag_core.errors import TagInputError
from tag_core.gnn import checkpoint as ckpt_mod
from tag_core.gnn.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from tag_core.gnn.features import (
    ACTION_FEATURES,
    DEV_FEATURES,
    EDGE_FEATURES,
    FEATURE_VERSION,
    OP_FEATURES,
    ProblemFeatures,
)
from tag_core.gnn.model import ModelConfig, PolicyNet, collate
from tag_core.gnn.prior import SHIPPED_CHECKPOINT, GnnPrior, choose_prior
from tag_core.gnn.problems import build_problem
from tag_core.search import Budget
from tag_core.simulate import OPTIONS

SMALL = ModelConfig(hidden=16, heads=2, layers=2, action_hidden=16)


def _net(seed: int = 0) -> PolicyNet:
    torch.manual_seed(seed)
    return PolicyNet(SMALL).eval()


def _root_sample(p):
    pf = ProblemFeatures(p.evaluator)
    actions = np.full(pf.G, p.evaluator.space.all_machines)
    return pf, pf.sample(actions, [], 0, p.evaluator.result(actions))


# ---- featurizer ------------------------------------------------------------------------


def test_sample_shapes_follow_the_schema_and_are_finite():
    p = problem()
    pf, s = _root_sample(p)
    G, M, K = pf.G, 3, p.evaluator.space.size
    assert s.op_x.shape == (G, len(OP_FEATURES)) and s.dev_x.shape == (M, len(DEV_FEATURES))
    assert s.action_x.shape == (K, len(ACTION_FEATURES)) and s.action_mask.shape == (K, M)
    for relation, x in s.edge_x.items():
        assert x.shape == (len(s.edges[relation][0]), len(EDGE_FEATURES[relation]))
        assert np.isfinite(x).all()
    assert np.isfinite(s.op_x).all() and np.isfinite(s.dev_x).all() and np.isfinite(s.action_x).all()
    # Every (group, machine) pair has an op->dev edge; every ordered machine pair a link.
    assert len(s.edges["runs_on"][0]) == G * M and len(s.edges["link"][0]) == M * (M - 1)
    # The state: group 0 is being decided, nothing decided yet, everything on all machines with AllReduce.
    col = {n: i for i, n in enumerate(OP_FEATURES)}
    assert s.op_x[:, col["deciding"]].tolist() == [1.0] + [0.0] * (G - 1)
    assert not s.op_x[:, col["decided"]].any() and (s.op_x[:, col["option_allreduce"]] == 1).all()
    assert (s.edge_x["runs_on"][:, -1] == 1).all()  # placed on every machine


def test_state_changes_show_up_in_the_features():
    p = problem()
    pf = ProblemFeatures(p.evaluator)
    space = p.evaluator.space
    single = space.index(space.masks[space.mask_names.index("a")], "duplicate")
    actions = np.full(pf.G, space.all_machines)
    actions[0] = single
    s = pf.sample(actions, [0], 1, p.evaluator.result(actions))
    col = {n: i for i, n in enumerate(OP_FEATURES)}
    assert s.op_x[0, col["decided"]] == 1 and s.op_x[1, col["deciding"]] == 1
    assert s.op_x[0, col["option_duplicate"]] == 1 and s.op_x[0, col["option_allreduce"]] == 0
    og, om = s.edges["runs_on"]
    placed = s.edge_x["runs_on"][:, -1]
    assert placed[(og == 0) & (om == 0)].tolist() == [1.0] and placed[(og == 0) & (om != 0)].tolist() == [0.0, 0.0]
    # Decided groups need not be a prefix: the tree decides in its own order.
    later = pf.sample(actions, [2, 0], 1, p.evaluator.result(actions))
    assert later.op_x[:, col["decided"]].nonzero()[0].tolist() == [0, 2]


def test_features_do_not_depend_on_absolute_speed():
    """Every GPU and link twice as fast: simulated times halve, the features stay (launch floor and fixed
    transfer latency aside, which are a few percent here)."""
    slow, fast = problem(scale=1.0), problem(scale=2.0)
    (_, a), (_, b) = _root_sample(slow), _root_sample(fast)
    assert fast.dp_time_s == pytest.approx(slow.dp_time_s / 2, rel=0.05)
    assert np.allclose(a.op_x, b.op_x, atol=0.05) and np.allclose(a.dev_x, b.dev_x, atol=0.05)
    assert np.allclose(a.action_x, b.action_x, atol=0.05)
    for r in a.edge_x:
        assert np.allclose(a.edge_x[r], b.edge_x[r], atol=0.05), r


def test_group_time_shares_do_not_depend_on_the_number_of_groups():
    coarse = build_problem(source(layers=6, groups=3), machines(), "dp")
    fine = build_problem(source(layers=6, groups=6), machines(), "dp")
    col = OP_FEATURES.index("time_share_b1")
    for p in (coarse, fine):  # log(G * t_g / sum t): the groups' shares average out to about 0, whatever G
        pf, s = _root_sample(p)
        assert abs(np.log(np.exp(s.op_x[:, col]).mean())) < 1e-4


# ---- network ---------------------------------------------------------------------------


def test_log_probabilities_normalise_per_sample_and_batching_changes_nothing():
    net = _net()
    (_, s1), (_, s2) = _root_sample(problem()), _root_sample(problem(order=(2, 0)))
    with torch.no_grad():
        both = net(collate([s1, s2]))
        one, two = net(collate([s1])), net(collate([s2]))
    k1 = len(s1.action_x)
    assert torch.allclose(both[:k1], one, atol=1e-5) and torch.allclose(both[k1:], two, atol=1e-5)
    assert float(one.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(two.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert len(two) != len(one)  # two machines vs three: different action counts, same weights


def test_machine_order_does_not_change_the_prior_of_an_action():
    """Permute the machines: the same (machine set, option) gets the same probability."""
    net = _net(1)

    def by_action(order):
        p = problem(order=order)
        _, s = _root_sample(p)
        names = [m.name for m in p.evaluator.sim.topology.machines]
        with torch.no_grad():
            probs = net(collate([s])).exp().numpy()
        space = p.evaluator.space
        return {(frozenset(n for n, on in zip(names, space.mask(a)) if on), space.option(a)): probs[a]
                for a in range(space.size)}

    first, second = by_action((0, 1, 2)), by_action((2, 0, 1))
    assert first.keys() == second.keys()
    for key in first:
        assert first[key] == pytest.approx(second[key], rel=1e-4, abs=1e-7), key


def test_network_size_does_not_depend_on_the_cluster():
    net = _net()
    count = sum(p.numel() for p in net.parameters())
    for order in ((0,), (0, 1), (0, 1, 2)):
        _, s = _root_sample(problem(order=order))
        with torch.no_grad():
            assert net(collate([s])).shape == (len(s.action_x),)
    assert sum(p.numel() for p in net.parameters()) == count


# ---- checkpoints -----------------------------------------------------------------------


def _saved(tmp_path, net=None, name="c.pt") -> tuple:
    net = net or _net()
    path = tmp_path / name
    digest = save_checkpoint(path, net, training={"models": ["hand"], "generations": 3}, metrics={"loss": 1.5})
    return path, digest, net


def test_checkpoint_round_trip_keeps_weights_and_metadata(tmp_path):
    path, digest, net = _saved(tmp_path)
    loaded = load_checkpoint(path)
    assert loaded.sha256 == digest and loaded.short_hash == digest[:16]
    assert loaded.training["generations"] == 3 and loaded.metrics["loss"] == 1.5
    assert loaded.net.config == SMALL
    _, s = _root_sample(problem())
    with torch.no_grad():
        assert torch.equal(net(collate([s])), loaded.net(collate([s])))


def test_missing_and_corrupt_checkpoints_are_input_errors(tmp_path):
    with pytest.raises(TagInputError, match="does not exist"):
        load_checkpoint(tmp_path / "none.pt")
    path, _, _ = _saved(tmp_path)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "noise.pt").write_bytes(os.urandom(4096))
    for name in ("cut.pt", "noise.pt"):
        with pytest.raises(TagInputError, match="not a readable TAG GNN checkpoint"):
            load_checkpoint(tmp_path / name, where="--checkpoint")


def test_foreign_and_incompatible_checkpoints_are_refused(tmp_path):
    net = _net()
    torch.save(net.state_dict(), tmp_path / "bare.pt")  # a plain state dict: weights but no header
    with pytest.raises(TagInputError, match="no 'tag-gnn-checkpoint' header"):
        load_checkpoint(tmp_path / "bare.pt")
    path, _, _ = _saved(tmp_path)
    payload = torch.load(path, weights_only=True)
    old = {**payload, "features": {**payload["features"], "version": FEATURE_VERSION - 1}}
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(TagInputError, match=f"feature version {FEATURE_VERSION - 1}.*retrain"):
        load_checkpoint(tmp_path / "old.pt")
    renamed = {**payload, "features": {**payload["features"], "op": list(reversed(payload["features"]["op"]))}}
    torch.save(renamed, tmp_path / "renamed.pt")
    with pytest.raises(TagInputError, match="different features \\(op differ\\)"):
        load_checkpoint(tmp_path / "renamed.pt")
    wrong = {**payload, "model_config": {**payload["model_config"], "hidden": 32, "heads": 2}}
    torch.save(wrong, tmp_path / "wrong.pt")
    with pytest.raises(TagInputError, match="does not fit the network"):
        load_checkpoint(tmp_path / "wrong.pt")
    broken = {**payload, "state_dict": {k: v.clone() for k, v in payload["state_dict"].items()}}
    next(v for v in broken["state_dict"].values() if v.is_floating_point()).fill_(float("nan"))
    torch.save(broken, tmp_path / "nan.pt")
    with pytest.raises(TagInputError, match="non-finite"):
        load_checkpoint(tmp_path / "nan.pt")
    next(v for v in broken["state_dict"].values() if v.is_floating_point()).fill_(1e38)
    torch.save(broken, tmp_path / "huge.pt")  # finite, but the activations overflow
    with pytest.raises(TagInputError, match="magnitude 1e\\+38"):
        load_checkpoint(tmp_path / "huge.pt")
    with pytest.raises(TagInputError, match="is a directory"):
        load_checkpoint(tmp_path)
    assert payload["format"] == FORMAT


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_that_runs_code_is_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "x": _Exploit()}, buffer, pickle_module=pickle)
    (tmp_path / "evil.pt").write_bytes(buffer.getvalue())
    with pytest.raises(TagInputError, match="not a readable"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


# ---- the prior hook and how it is chosen --------------------------------------------------


def test_gnn_prior_guides_mcts_deterministically_and_keeps_a_floor():
    def run():
        p = problem()
        prior = GnnPrior(_net(2))
        search = p.search(seed=4, prior=prior)
        return search.run(Budget(iterations=12)), prior, search

    (r1, prior, search), (r2, _, _) = run(), run()
    assert np.array_equal(r1.actions, r2.actions) and r1.trace == r2.trace
    assert prior.calls >= 2 and prior.seconds > 0
    root = search.root.prior
    assert root.min() >= prior.floor / len(root) - 1e-12 and root.sum() == pytest.approx(1.0)
    # The root prior is the network's distribution, mixed with the floor.
    _, s = _root_sample(problem())
    net_p = prior.probabilities([s])[0]
    assert np.allclose(root, (1 - prior.floor) * net_p + prior.floor / len(net_p), atol=1e-6)


def test_choose_prior_rules(tmp_path, monkeypatch):
    good, digest, _ = _saved(tmp_path)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert choose_prior("uniform").prior is None and choose_prior("uniform").lineage()["prior"] == "uniform"
    chosen = choose_prior("gnn", good)
    assert chosen.kind == "gnn" and isinstance(chosen.prior, GnnPrior) and chosen.checkpoint_hash == digest[:16]
    assert chosen.lineage() == {"prior": "gnn", "checkpoint": digest[:16], "checkpoint_file": str(good)}
    with pytest.raises(TagInputError, match="--checkpoint: .*not a readable"):
        choose_prior("gnn", bad)  # asked for the GNN: no silent fallback
    with pytest.raises(TagInputError, match="--checkpoint: .*does not exist"):
        choose_prior(None, tmp_path / "gone.pt")  # an explicit file must exist
    with pytest.raises(TagInputError, match="only applies to --prior gnn"):
        choose_prior("uniform", good)
    with pytest.raises(TagInputError, match="must be one of"):
        choose_prior("random")
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", str(good))
    assert choose_prior().kind == "gnn" and choose_prior().checkpoint_hash == digest[:16]
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", str(bad))
    fallback = choose_prior()  # the default checkpoint is unusable: uniform, but said out loud
    assert fallback.kind == "uniform" and fallback.prior is None and "not a readable" in fallback.warning
    assert "uniform priors instead" in fallback.warning and fallback.lineage()["checkpoint"] is None
    with pytest.raises(TagInputError, match="--prior gnn: .*not a readable"):
        choose_prior("gnn")
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", str(tmp_path / "gone.pt"))
    assert choose_prior().kind == "uniform" and "does not exist" in choose_prior().warning
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", "")
    assert choose_prior().kind == "uniform" and choose_prior().warning is None
    with pytest.raises(TagInputError, match="needs a checkpoint"):
        choose_prior("gnn")


def test_shipped_checkpoint_loads_when_present():
    if not SHIPPED_CHECKPOINT.exists():
        pytest.skip("no checkpoint shipped yet")
    loaded = load_checkpoint(SHIPPED_CHECKPOINT)
    assert SHIPPED_CHECKPOINT.stat().st_size <= 20e6
    assert loaded.training["generations"] > 0 and loaded.metrics.get("curve")
    assert len(OPTIONS) == 4 and ckpt_mod.FORMAT_VERSION == 1
