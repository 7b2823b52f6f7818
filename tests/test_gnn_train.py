"""AlphaZero-style training: examples from visit counts, determinism for a seed, exact resume, the curve."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gnn_helpers import source

from tag_core.errors import TagInputError
from tag_core.gnn.checkpoint import load_checkpoint
from tag_core.gnn.model import ModelConfig, PolicyNet
from tag_core.gnn.train import TrainConfig, run_episode, train
from tag_core.report import training_curve

SMALL = ModelConfig(hidden=16, heads=2, layers=2, action_hidden=16).to_dict()


def _cfg(**kw) -> TrainConfig:
    base = dict(models=["hand"], topologies=3, minutes=None, generations=2, episodes=2, iterations=10,
                min_visits=3, epochs=1, batch_size=8, seed=5, model=SMALL)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def sources():
    return {"hand": source(layers=4, groups=4)}


def _weights(path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).net.state_dict()


def test_an_episode_turns_visit_counts_into_policy_targets(sources):
    cfg = _cfg()
    torch.manual_seed(0)
    result = run_episode(PolicyNet(ModelConfig(**SMALL)).eval(), sources, cfg, generation=0, episode=0)
    assert result is not None and result.model == "hand" and 0 <= result.topology_seed < cfg.topologies
    assert result.examples, "the root alone has `iterations` visits"
    root = result.examples[0]
    assert root.sample.deciding == 0 and root.target.shape == (len(root.sample.action_x),)
    for ex in result.examples:
        assert ex.target.sum() == pytest.approx(1.0) and (ex.target >= 0).all()
        # Targets are visit shares: multiples of 1/visits with at least min_visits visits.
        visits = ex.target * (1 / ex.target[ex.target > 0].min())
        assert np.allclose(visits, np.round(visits), atol=1e-4)
    assert round(1 / root.target[root.target > 0].min()) <= cfg.iterations


def test_training_is_deterministic_for_a_seed_and_records_its_curve(sources, tmp_path):
    h1, training, metrics = train(_cfg(), sources, tmp_path / "a.pt", show_progress=False)
    h2, _, _ = train(_cfg(), sources, tmp_path / "b.pt", show_progress=False)
    a, b = _weights(tmp_path / "a.pt"), _weights(tmp_path / "b.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = train(_cfg(seed=6), sources, tmp_path / "c.pt", show_progress=False)
    c = _weights(tmp_path / "c.pt")
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert training["generations"] == 2 and len(metrics["curve"]) == 2 and training["models"] == ["hand"]
    assert training["topology_seeds"] == [0, 3] and training["examples"] > 0
    assert all(p["loss"] is not None and p["loss"] > 0 for p in metrics["curve"])
    assert other[0] != h1
    png = training_curve(metrics)
    assert png.startswith(b"\x89PNG") and len(png) > 2000


def test_resume_continues_exactly_where_it_stopped(sources, tmp_path):
    train(_cfg(generations=2), sources, tmp_path / "straight.pt", show_progress=False)
    train(_cfg(generations=1), sources, tmp_path / "half.pt", show_progress=False)
    half = load_checkpoint(tmp_path / "half.pt")
    assert half.training["generations"] == 1 and half.optimizer is not None
    _, training, metrics = train(_cfg(generations=2), sources, tmp_path / "resumed.pt", resume=half,
                                 show_progress=False)
    straight, resumed = _weights(tmp_path / "straight.pt"), _weights(tmp_path / "resumed.pt")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert training["generations"] == 2 and len(metrics["curve"]) == 2
    assert [s["from_generation"] for s in training["sessions"]] == [0, 1]
    assert training["sessions"][1]["resumed_from"] == half.short_hash


def test_training_refuses_models_it_has_no_graph_for(sources, tmp_path):
    with pytest.raises(TagInputError, match="no captured graph for vgg19"):
        train(_cfg(models=["hand", "vgg19"]), sources, tmp_path / "x.pt", show_progress=False)
    with pytest.raises(TagInputError, match="time budget or a number of generations"):
        _cfg(generations=None, minutes=None)
