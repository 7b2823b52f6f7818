"""Plan files carry their topology snapshot; `tag plans import` stores them and refuses tampered ones."""

from __future__ import annotations

import copy
import json

import duckdb
import pytest

from tag_core.cli import main
from tag_core.plan.plan_file import check_plan_file


def test_a_plan_carries_the_snapshot_it_was_made_for(plan_data):
    carried = plan_data["topology_snapshot"]
    checked = check_plan_file(plan_data, "plan.json")
    assert checked.topology.content_hash() == carried["hash"] == plan_data["lineage"]["topology_hash"]
    assert checked.topology.name == plan_data["topology"] and checked.topology.num_devices == 4
    assert checked.plan_id == check_plan_file(copy.deepcopy(plan_data), "again").plan_id


def _tampered(data: dict, edit) -> dict:
    data = copy.deepcopy(data)
    edit(data)
    return data


TAMPERED = [
    ("snapshot edited by hand", lambda d: d["topology_snapshot"]["snapshot"]["machines"][0].update(count=8),
     "plan.json: topology_snapshot.snapshot: hashes to"),
    ("lineage hash wrong", lambda d: d["lineage"].update(topology_hash="0" * 16), "plan.json: lineage.topology_hash:"),
    ("snapshot missing", lambda d: d.pop("topology_snapshot"), "plan.json: topology_snapshot: is missing"),
    ("snapshot not a topology", lambda d: d["topology_snapshot"]["snapshot"]["machines"][0].update(gpu="TPUv9"),
     "plan.json: topology_snapshot.snapshot."),
    ("renamed topology", lambda d: d.update(topology="other"), "plan.json: topology: is 'other'"),
    ("strategy broken", lambda d: d["strategy"].update(batch_shares="x"), "plan.json: strategy:"),
    ("time not a number", lambda d: d["tag"].update(iteration_time_s="fast"), "plan.json: tag.iteration_time_s:"),
    ("not an object", lambda d: d.clear() or d.update(model=3), "plan.json: model: must be a non-empty string"),
]


@pytest.mark.parametrize("what, edit, expected", TAMPERED, ids=[t[0] for t in TAMPERED])
def test_tag_plans_import_refuses_a_tampered_plan_and_writes_nothing(plan_data, what, edit, expected, tmp_path,
                                                                      capsys, monkeypatch):
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "home"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_tampered(plan_data, edit)))
    monkeypatch.chdir(tmp_path)
    assert main(["plans", "import", "plan.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tag: error: {expected}"), (what, err)
    assert not (tmp_path / "home").exists()  # checked before the store opens


def test_tag_plans_import_stores_a_plan_once(plan_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "home"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_data))
    assert main(["plans", "import", str(path)]) == 0
    assert main(["plans", "import", str(path)]) == 0
    out = capsys.readouterr().out
    assert "stored plan" in out and "is already stored" in out
    with duckdb.connect(str(tmp_path / "home" / "tag.duckdb"), read_only=True) as conn:
        plans = conn.execute("SELECT model, topology, source, topology_hash FROM plans").fetchall()
        snapshots = conn.execute("SELECT topology, content_hash FROM topology_snapshots").fetchall()
    hash_ = plan_data["topology_snapshot"]["hash"]
    assert plans == [(plan_data["model"], plan_data["topology"], "import", hash_)]
    assert snapshots == [(plan_data["topology"], hash_)]


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_bad_store_wait_is_named(plan_data, value, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TAG_STORE_WAIT_S", value)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_data))
    assert main(["plans", "import", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tag: error: TAG_STORE_WAIT_S: must be a number of seconds"), err
