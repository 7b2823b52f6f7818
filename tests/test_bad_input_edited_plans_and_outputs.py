"""More bad input to the CLI: one `tag: error: <where>: ...` line, exit 2, nothing written or stored.

Hand-edited plan files that `tag plans import` used to store (and that then broke DuckDB's insert or every
later `tag report`), batch sizes past int32, output paths that are devices or FIFOs, and a bare strategy
given to `tag emit --plan` without a topology."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from tag_core.cli import main

TESTBED = str(Path(__file__).parents[1] / "examples" / "topologies" / "testbed.json")


def error_of(capsys, where: str) -> str:
    """The one stderr line, which must name `where`."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tag: error: {where}: "), err
    return err


def _edited(data: dict, edit) -> dict:
    data = copy.deepcopy(data)
    edit(data)
    return data


# Each of these passed the plan-file check: the first five then failed in DuckDB's insert (a traceback),
# the rest were stored and made `tag report` fail (a traceback, or exit 2 for every plan, with a half-written
# report folder).
EDITED = [
    ("speedup a string", lambda d: d.update(speedup_vs_dp_nccl="fast"), "speedup_vs_dp_nccl",
     "must be a finite number >= 0 or null"),
    ("seed a string", lambda d: d["lineage"].update(seed="abc"), "lineage.seed", "must be a 32-bit integer"),
    ("seed past int32", lambda d: d["lineage"].update(seed=10**12), "lineage.seed", "must be a 32-bit integer"),
    ("graph hash an object", lambda d: d["lineage"].update(graph_hash={"a": 1}), "lineage.graph_hash",
     "must be a string or null"),
    ("code version a list", lambda d: d["lineage"].update(code_version=[1]), "lineage.code_version",
     "must be a string or null"),
    ("ideal time a string", lambda d: d.update(ideal_time_s="abc"), "ideal_time_s", "must be a finite number"),
    ("calibration a string", lambda d: d.update(calibration="abc"), "calibration", "must be an object or null"),
    ("baseline a string", lambda d: d["baselines"].update(horovod="abc"), "baselines.horovod", "must be an object"),
    ("baseline oom a string", lambda d: d["baselines"]["dp_nccl"].update(oom="no"), "baselines.dp_nccl.oom",
     "must be true or false"),
    ("no batch size", lambda d: d.pop("batch_size"), "batch_size", "must be an integer in [1, 2147483647]"),
    ("batch size zero", lambda d: d.update(batch_size=0), "batch_size", "must be an integer in [1, 2147483647]"),
    ("batch size a string", lambda d: d.update(batch_size="16"), "batch_size", "must be an integer"),
    ("groups a string", lambda d: d.update(groups="abc"), "groups", "must be a positive integer"),
    ("mask shorter than the snapshot", lambda d: d["strategy"]["groups"][0].update(mask=[1]),
     "strategy: groups[0].mask", "has 1 entries but the topology has 2 machines"),
    ("one share for four devices", lambda d: d["strategy"].update(batch_shares=[1.0]), "strategy: batch_shares",
     "has 1 entries but the topology has 4 devices"),
    ("machines of another topology", lambda d: d["strategy"].setdefault("extra", {}).update(machines=["a", "b"]),
     "strategy: extra.machines", "names machines topology"),
]


@pytest.mark.parametrize("what, edit, field, problem", EDITED, ids=[e[0] for e in EDITED])
def test_plans_import_refuses_fields_the_store_and_report_read(plan_data, what, edit, field, problem, tmp_path,
                                                               capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps(_edited(plan_data, edit)))
    db = tmp_path / "tag.duckdb"
    assert main(["--db", str(db), "plans", "import", "plan.json"]) == 2
    assert problem in error_of(capsys, f"plan.json: {field}")
    assert not db.exists()  # checked before the store opens


def test_plans_import_still_stores_a_plan_as_tag_plan_writes_it(plan_data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps(plan_data))
    assert main(["--db", str(tmp_path / "tag.duckdb"), "plans", "import", "plan.json"]) == 0
    assert "stored plan" in capsys.readouterr().out


# ---- batch sizes past int32: TF's shapes and the INTEGER columns hold no more ------------------------------


@pytest.mark.parametrize("command", [
    ["simulate", "mlp", "--topology", TESTBED, "--strategy", "ps", "--batch-size", "9999999999999999999"],
    ["sfb", "mlp", "--topology", TESTBED, "--batch-size", "2147483648"],
    ["emit", "mlp", "--strategy", "ps", "--topology", TESTBED, "--out", "out", "--batch-size", "2147483648"],
    ["capture", "mlp", "--batch-size", "2147483648"],
    ["fuse", "mlp", "--batch-size", "2147483648"],
    ["profile", "mlp", "--batch-size", "2147483648"],
], ids=["simulate", "sfb", "emit", "capture", "fuse", "profile"])
def test_batch_size_past_int32_names_the_argument(command, tmp_path, capsys, monkeypatch, tag_home):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:  # argparse's own error, as for every other bad number
        main(command)
    assert exited.value.code == 2
    assert "must be an integer in [1, 2147483647]" in error_of(capsys, "argument --batch-size")
    assert not tag_home.exists() and not (tmp_path / "out").exists()


def test_profile_batch_sizes_past_int32_names_the_argument(capsys, tag_home):
    with pytest.raises(SystemExit) as exited:
        main(["profile", "mlp", "--batch-sizes", "1,2147483648"])
    assert exited.value.code == 2
    assert "of at most 2147483647" in error_of(capsys, "argument --batch-sizes")
    assert not tag_home.exists()


# ---- output paths that are not regular files --------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_topology_random_refuses_to_replace_a_fifo(tmp_path, capsys):
    """The rename of the atomic write used to replace a FIFO (or, as root, /dev/full) with a plain file."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert main(["topology", "random", "--out", str(fifo)]) == 2
    assert "is not a regular file" in error_of(capsys, "--out")
    assert fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]  # no temporary left beside it


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_simulate_timeline_refuses_a_fifo_before_the_capture(tmp_path, capsys, tag_home):
    fifo = tmp_path / "timeline.png"
    os.mkfifo(fifo)
    assert main(["simulate", "mlp", "--topology", TESTBED, "--strategy", "ps", "--timeline", str(fifo)]) == 2
    assert "is not a regular file" in error_of(capsys, "--timeline")
    assert fifo.is_fifo() and not tag_home.exists()


# ---- emit --plan with a bare strategy ------------------------------------------------------------------------


def test_emit_bare_strategy_as_plan_asks_for_a_topology(plan_data, tmp_path, capsys, monkeypatch):
    """It used to say "the plan names topology None"."""
    monkeypatch.chdir(tmp_path)
    Path("strategy.json").write_text(json.dumps(plan_data["strategy"]))
    assert main(["emit", "mlp", "--plan", "strategy.json", "--out", "out"]) == 2
    assert "names no topology and carries no snapshot" in error_of(capsys, "--topology")
    assert not (tmp_path / "out").exists()
