"""`tag train-gnn` and `tag plan --prior`: checkpoints written, resumed, used, refused, and recorded in lineage."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch

from tag_core import store
from tag_core.cli import main
from tag_core.gnn.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
MODEL = "mlp"
TRAIN = ["--models", MODEL, "--topologies", "2", "--episodes", "1", "--iterations", "12", "--quiet"]
PLAN = ["--budget-iterations", "6", "--groups", "8", "--batch-size", "8", "--json"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One capture and one single-generation training run on a fresh store."""
    tmp = tmp_path_factory.mktemp("gnn")
    db, ckpt = tmp / "tag.duckdb", tmp / "gnn.pt"
    topo = tmp / "tiny.json"
    topo.write_text(json.dumps({"name": "tiny", "inter_gbps": 10, "machines": [
        {"name": "m0", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
        {"name": "m1", "gpu": "T4", "count": 2, "intra_gbps": 50}]}))
    code = main(["--db", str(db), "train-gnn", "--out", str(ckpt), "--generations", "1", *TRAIN])
    return code, db, ckpt, topo, tmp


def _plan(db: Path, topo: Path, *extra: str) -> int:
    return main(["--db", str(db), "plan", MODEL, "--topology", str(topo), *PLAN, *extra])


def test_train_gnn_writes_a_checkpoint_and_its_curve(trained, capsys):
    code, _, ckpt, _, _ = trained
    assert code == 0
    loaded = load_checkpoint(ckpt)
    assert loaded.training["generations"] == 1 and loaded.training["models"] == [MODEL]
    assert loaded.training["config"]["iterations"] == 12 and loaded.training["topology_seeds"] == [0, 2]
    assert ckpt.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert ckpt.stat().st_size < 20e6


def test_train_gnn_resumes_with_the_checkpoint_settings(trained, capsys):
    _, db, ckpt, _, tmp = trained
    out = tmp / "more.pt"
    assert main(["--db", str(db), "train-gnn", "--out", str(out), "--resume", str(ckpt), "--generations", "2",
                 "--quiet"]) == 0
    more = load_checkpoint(out)
    assert more.training["generations"] == 2 and more.training["models"] == [MODEL]
    assert more.training["config"]["iterations"] == 12  # taken from the checkpoint, not the default
    assert len(more.metrics["curve"]) == 2 and "2 generations" in capsys.readouterr().out


def test_train_gnn_bad_input_exits_2(trained, tmp_path, capsys):
    _, db, ckpt, _, _ = trained
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\0" * 100)
    cases = [
        (["--out", str(tmp_path / "no" / "dir" / "x.pt"), "--generations", "1", *TRAIN], "--out"),
        (["--out", str(tmp_path / "x.pt"), "--resume", str(junk), "--generations", "1"], "--resume"),
        (["--out", str(tmp_path / "x.pt"), "--resume", str(tmp_path / "gone.pt")], "does not exist"),
        (["--out", str(tmp_path / "x.pt"), "--models", "nope", "--generations", "1"], "unknown model"),
        (["--out", str(tmp_path / "x.pt"), "--models", "", "--generations", "1"], "at least one model"),
    ]
    for args, expected in cases:
        assert main(["--db", str(db), "train-gnn", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("tag: error:") and expected in err[-1], (args, err)
    with pytest.raises(SystemExit) as info:
        main(["--db", str(db), "train-gnn", "--out", str(tmp_path / "x.pt"), "--minutes", "-1"])
    assert info.value.code == 2


def test_plan_with_the_gnn_prior_records_the_checkpoint(trained, capsys, monkeypatch):
    _, db, ckpt, topo, _ = trained
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", "")
    digest = load_checkpoint(ckpt).short_hash
    assert _plan(db, topo, "--prior", "gnn", "--checkpoint", str(ckpt)) == 0
    gnn = json.loads(capsys.readouterr().out)
    assert gnn["lineage"]["prior"] == "gnn" and gnn["lineage"]["checkpoint"] == digest
    assert _plan(db, topo, "--prior", "uniform") == 0
    uniform = json.loads(capsys.readouterr().out)
    assert uniform["lineage"]["prior"] == "uniform" and uniform["lineage"]["checkpoint"] is None
    with duckdb.connect(str(db), read_only=True) as conn:
        rows = store.plan_lineage(conn, MODEL, "tiny")
    assert rows.checkpoint_hash.tolist()[-2:] == [digest, None]  # "which checkpoint made this plan" is one query


def test_plan_default_prior_uses_a_present_checkpoint_and_falls_back_loudly(trained, capsys, monkeypatch, tmp_path):
    _, db, ckpt, topo, _ = trained
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", str(ckpt))
    assert _plan(db, topo) == 0
    assert json.loads(capsys.readouterr().out)["lineage"]["prior"] == "gnn"
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(ckpt.read_bytes()[:500])
    monkeypatch.setenv("TAG_GNN_CHECKPOINT", str(corrupt))
    assert _plan(db, topo) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["lineage"]["prior"] == "uniform"
    assert "tag: warning:" in captured.err and "uniform priors instead" in captured.err
    # Asked for explicitly, an unusable checkpoint is an error, never a silent fallback.
    assert _plan(db, topo, "--prior", "gnn") == 2
    assert "tag: error: --prior gnn:" in capsys.readouterr().err
    assert _plan(db, topo, "--prior", "gnn", "--checkpoint", str(corrupt)) == 2
    assert "tag: error: --checkpoint:" in capsys.readouterr().err


def test_incompatible_feature_version_is_an_error_naming_the_fix(trained, capsys, tmp_path):
    _, db, ckpt, topo, _ = trained
    payload = torch.load(ckpt, weights_only=True)
    payload["features"] = {**payload["features"], "version": 0}
    old = tmp_path / "old.pt"
    torch.save(payload, old)
    assert _plan(db, topo, "--checkpoint", str(old)) == 2
    err = capsys.readouterr().err
    assert "feature version 0" in err and "tag train-gnn" in err
