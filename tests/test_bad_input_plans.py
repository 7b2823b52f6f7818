"""Bad plan, strategy and fusion files given to `tag simulate`, `sfb`, `emit` and `plan`: one line on
stderr naming the field or argument, exit 2, and nothing captured or written. Drives the real CLI."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import duckdb
import pytest

from tag_core import store
from tag_core.capture import load_op_graph
from tag_core.cli import main
from tag_core.simulate import Strategy

MODEL = "mlp[features=8,hidden=8]"
TOPOLOGY = {"name": "pair", "inter_gbps": 10, "machines": [
    {"name": "m0", "gpu": "V100-16GB", "count": 1, "intra_gbps": 100},
    {"name": "m1", "gpu": "T4", "count": 1, "intra_gbps": 50}]}


def _topology(tmp_path: Path) -> Path:
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(TOPOLOGY))
    return path


def _plan(ops: int = 10, **strategy_changes) -> dict:
    """A plan as `tag plan` writes it (the parts the commands read), for MODEL on the pair topology."""
    strategy = Strategy.uniform(ops, 2, 2, extra={"machines": ["m0", "m1"]}).to_dict()
    strategy.update(strategy_changes)
    return {"model": MODEL, "topology": "pair", "batch_size": 8, "groups": 1, "strategy": strategy}


def _write(tmp_path: Path, data, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _one_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tag: error: "), err
    assert all(f in err[0] for f in fragments), err
    return err[0]


def _commands(tmp_path: Path, file: Path) -> dict[str, list[str]]:
    """Every command reading a plan file, with its own --db (which must stay absent on bad input)."""
    topo, db = str(_topology(tmp_path)), str(tmp_path / "tag.duckdb")
    out = str(tmp_path / "out")
    return {
        "simulate": ["--db", db, "simulate", MODEL, "--topology", topo, "--strategy", str(file)],
        "sfb": ["--db", db, "sfb", MODEL, "--topology", topo, "--plan", str(file)],
        "emit": ["--db", db, "emit", MODEL, "--topology", topo, "--plan", str(file), "--out", out],
        "plan": ["--db", db, "plan", MODEL, "--topology", topo, "--warm-start", str(file)],
    }


def _refused_before_anything(tmp_path: Path, capsys, command: str, file: Path, *fragments: str) -> None:
    assert main(_commands(tmp_path, file)[command]) == 2
    _one_error(capsys, *fragments)
    assert not (tmp_path / "tag.duckdb").exists(), "refused before capturing anything"
    assert not (tmp_path / "out").exists()


COMMANDS = ["simulate", "sfb", "emit", "plan"]


# ---- 1, 2, 7: the strategy's own fields, checked before any capture ---------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text, fragment", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                            ('{"op_groups": NaN}', "NaN is not valid JSON"),
                                            (b"\xff\xfe{}", "is not UTF-8 text")])
def test_files_that_are_not_json_name_the_argument(tmp_path, capsys, tag_home, command, text, fragment):
    file = tmp_path / "bad.json"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    argument = {"simulate": "--strategy", "sfb": "--plan", "emit": "--plan", "plan": "--warm-start"}[command]
    _refused_before_anything(tmp_path, capsys, command, file, f"{argument}: ", fragment)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("extra", ["abc", [1, 2]])
def test_extra_must_be_an_object(tmp_path, capsys, tag_home, command, extra):
    file = _write(tmp_path, _plan(extra=extra))
    _refused_before_anything(tmp_path, capsys, command, file, "extra: must be a JSON object")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("field, value, fragment", [
    ("op_groups", [2**70] * 10, "op_groups: group indices must lie in [0, 1)"),
    ("op_devices", [2**70] * 10, "op_devices: device indices must lie in [-1, 2)"),
    ("num_ops", 2**70, "num_ops: required (an integer in"),
    ("fusion_bytes", 2**70, "fusion_bytes: must be an integer in"),
    ("extra", {"machines": "m0"}, "extra.machines: must be a list of machine names"),
])
def test_oversized_integers_name_the_field(tmp_path, capsys, tag_home, command, field, value, fragment):
    changes = {field: value, **({"op_groups": None} if field == "num_ops" else {})}
    file = _write(tmp_path, _plan(**changes))
    _refused_before_anything(tmp_path, capsys, command, file, fragment)


def test_a_bad_strategy_on_a_fresh_store_captures_nothing(tmp_path, capsys, tag_home):
    file = _write(tmp_path, {"groups": [{"mask": [1, 1], "option": "allreduce"}], "batch_shares": [1, 1],
                             "num_ops": 3, "extra": "abc"})
    assert main(["simulate", MODEL, "--topology", str(_topology(tmp_path)), "--strategy", str(file)]) == 2
    _one_error(capsys, f"--strategy {file}: extra")  # no "no op profiles" note: nothing was captured
    assert not tag_home.exists()


# ---- 3: one check of a plan against the model and topology, in simulate, sfb and emit ---------------


@pytest.mark.parametrize("command", ["simulate", "sfb", "emit"])
@pytest.mark.parametrize("change, fragment", [
    ({"model": "small_cnn"}, "model: was made for model 'small_cnn', not"),
    ({"topology": "elsewhere"}, "topology: was made for topology 'elsewhere', not 'pair'"),
    ({"machines": ["m0", "gone"]}, "extra.machines: names machines topology 'pair' does not have: gone"),
    ({"machines": ["m1", "m0"]}, "extra.machines: must list the machines of topology 'pair' in its order: m0, m1"),
])
def test_a_plan_for_another_model_or_topology_is_refused(tmp_path, capsys, tag_home, command, change, fragment):
    plan = _plan()
    if "machines" in change:
        plan["strategy"]["extra"]["machines"] = change["machines"]
    else:
        plan.update(change)
    file = _write(tmp_path, plan)
    _refused_before_anything(tmp_path, capsys, command, file, fragment)


@pytest.mark.slow
def test_sfb_checks_the_plan_shape_against_the_captured_graph(tmp_path, capsys, tag_home):
    assert main(["capture", MODEL]) == 0
    conn = store.connect()
    num_ops = len(load_op_graph(conn, MODEL).ops)
    conn.close()
    topo = str(_topology(tmp_path))
    cases = [
        (_plan(num_ops, batch_shares=[1.0, 1.0, 1.0]), "batch_shares: has 3 entries but the topology has 2 devices"),
        (_plan(num_ops + 4), f"op_groups: has {num_ops + 4} entries but the graph has {num_ops} ops"),
    ]
    for plan, fragment in cases:
        plan["strategy"].pop("extra")  # unnamed machines: only the shapes tell
        file = _write(tmp_path, plan)
        capsys.readouterr()
        assert main(["sfb", MODEL, "--topology", topo, "--plan", str(file)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("tag: note:")]
        assert len(err) == 1 and err[0].startswith(f"tag: error: --plan {file}: {fragment}"), err


# ---- 4: emit's batch_size ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch", ["abc", -5, 0, True, 2**40])
def test_emit_names_a_bad_batch_size(tmp_path, capsys, tag_home, batch):
    file = _write(tmp_path, {**_plan(), "batch_size": batch})
    _refused_before_anything(tmp_path, capsys, "emit", file, "batch_size: must be an integer in [1, ")


# ---- 5, 6: tag plan -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One quick `tag plan` on a fresh store: (db, topology file, plan file)."""
    tmp = tmp_path_factory.mktemp("planned")
    db, topo, out = tmp / "tag.duckdb", _topology(tmp), tmp / "plan.json"
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "3", "--groups",
                 "4", "--no-sfb", "--prior", "uniform", "--out", str(out)]) == 0
    return db, topo, out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plan_rows(db: Path) -> list:
    with duckdb.connect(str(db), read_only=True) as conn:
        return conn.execute("SELECT plan_id, seed, warm_start_from FROM plans ORDER BY created_at").fetchall()


@pytest.mark.parametrize("args, where", [
    (["--seed", str(2**31)], "--seed"),
    (["--seed", str(2**70)], "--seed"),
    (["--batch-size", str(2**31)], "--batch-size"),
])
@pytest.mark.slow
def test_plan_integers_past_the_store_columns_change_nothing(planned, tmp_path, capsys, args, where):
    db, topo, out = planned
    before_file, before_rows = _digest(out), _plan_rows(db)
    with pytest.raises(SystemExit) as exit_info:
        main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "2", "--groups", "4",
              "--no-sfb", "--prior", "uniform", "--out", str(out), *args])
    assert exit_info.value.code == 2
    _one_error(capsys, f"argument {where}: must be an integer in")
    assert _digest(out) == before_file and _plan_rows(db) == before_rows


@pytest.mark.slow
def test_plan_at_the_largest_seed_is_stored_and_written(planned, tmp_path, capsys):
    db, topo, _ = planned
    out = tmp_path / "again.json"
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "2", "--groups",
                 "4", "--no-sfb", "--prior", "uniform", "--seed", str(2**31 - 1), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["lineage"]["seed"] == 2**31 - 1
    assert _plan_rows(db)[-1][1] == 2**31 - 1


def _warm_variants(plan: dict) -> dict[str, tuple[dict, str]]:
    strategy = plan["strategy"]
    other_ops = copy.deepcopy(plan)
    # op_devices goes too: a plan with model-parallel groups (profiles are measured) has one entry per op
    other_ops["strategy"].update(op_groups=None, num_ops=strategy["num_ops"] + 3, op_devices=None)
    other_model = {**copy.deepcopy(plan), "model": "small_cnn"}
    unnamed = copy.deepcopy(plan)
    unnamed["strategy"].pop("extra")
    for group in unnamed["strategy"]["groups"]:
        group["mask"] = group["mask"] + [1]
    unknown = copy.deepcopy(plan)
    unknown["strategy"]["extra"]["machines"] = ["x", "y"]
    return {
        "ops": (other_ops, f"it has {strategy['num_ops'] + 3} ops, {MODEL} has {strategy['num_ops']}"),
        "model": (other_model, "it was made for model 'small_cnn'"),
        "masks": (unnamed, "its masks cover 3 machines, pair has 2"),
        "machines": (unknown, "none of its machines (x, y) is in pair"),
    }


@pytest.mark.parametrize("variant", ["ops", "model", "masks", "machines"])
@pytest.mark.slow
def test_an_unusable_warm_start_is_noted_and_not_recorded(planned, tmp_path, capsys, variant):
    db, topo, out = planned
    data, why = _warm_variants(json.loads(out.read_text()))[variant]
    warm = _write(tmp_path, data, "warm.json")
    capsys.readouterr()
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "2", "--groups",
                 "4", "--no-sfb", "--prior", "uniform", "--warm-start", str(warm), "--json"]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if line.startswith("tag: ")]
    assert len(notes) == 1 and notes[0].startswith(f"tag: note: --warm-start {warm}: {why}"), notes
    assert notes[0].endswith("; searching without it")
    assert json.loads(captured.out)["lineage"]["warm_start_from"] is None
    assert _plan_rows(db)[-1][2] is None


@pytest.mark.slow
def test_a_warm_start_on_a_changed_topology_still_maps(planned, tmp_path, capsys):
    db, _, out = planned
    grown = {**TOPOLOGY, "name": "grown", "machines": [*TOPOLOGY["machines"],
                                                        {"name": "m2", "gpu": "T4", "count": 1, "intra_gbps": 50}]}
    topo = _write(tmp_path, grown, "grown.json")
    capsys.readouterr()
    assert main(["--db", str(db), "plan", MODEL, "--topology", str(topo), "--budget-iterations", "2", "--groups",
                 "4", "--no-sfb", "--prior", "uniform", "--warm-start", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "tag: note: --warm-start" not in captured.err
    assert json.loads(captured.out)["lineage"]["warm_start_from"] == str(out)
    assert _plan_rows(db)[-1][2] == str(out)


# ---- 8: emit --fusion files ----------------------------------------------------------------------------


@pytest.mark.parametrize("data, fragment", [
    ({"model": MODEL, "patterns": [[1, 2]], "kernels_before": 3, "kernels_after": 2}, "patterns[0]: must be"),
    ({"patterns": [], "kernels_before": 3, "kernels_after": 2}, "model: missing field"),
    ([["a", "b"]], "fusion plan: must be a JSON object"),
    ({"model": MODEL, "patterns": "abc", "kernels_before": 3, "kernels_after": 2}, "patterns: must be a list"),
    ({"model": MODEL, "patterns": [], "kernels_before": "3", "kernels_after": 2}, "kernels_before: must be"),
    ({"model": MODEL, "patterns": [], "kernels_before": 3, "kernels_after": 2, "measured": []}, "measured: must"),
    ({"model": MODEL, "patterns": [], "kernels_before": 3, "kernels_after": 2, "regions": [["a"], 5]},
     "regions[1]: must be a non-empty list of op names"),
    ({"model": MODEL, "patterns": [], "kernels_before": 3, "kernels_after": 2, "regions": [["no/such/op", "x"]]},
     "the fusion plan names ops the captured graph does not have (no/such/op, x)"),
])
def test_emit_names_what_is_wrong_in_a_fusion_file(tmp_path, capsys, tag_home, data, fragment):
    fusion = _write(tmp_path, data, "fusion.json")
    out = tmp_path / "out"
    assert main(["emit", MODEL, "--topology", str(_topology(tmp_path)), "--strategy", "allreduce", "--out", str(out),
                 "--fusion", str(fusion)]) == 2
    checked_against_capture = "captured graph" in fragment  # op names are checked once the model is captured
    _one_error(capsys, f"--fusion: {fragment}" if checked_against_capture else f"--fusion {fusion}: {fragment}")
    assert not out.exists() and (checked_against_capture or not tag_home.exists())


# ---- 9, 10: directories, and sfb's --strategy ---------------------------------------------------------


def test_a_directory_is_named_as_one(tmp_path, capsys, tag_home):
    folder = tmp_path / "folder"
    folder.mkdir()
    d, topo, out = str(folder), str(_topology(tmp_path)), str(tmp_path / "out")
    cases = [
        (["simulate", MODEL, "--topology", topo, "--strategy", d], "--strategy"),
        (["sfb", MODEL, "--topology", topo, "--plan", d], "--plan"),
        (["emit", MODEL, "--topology", topo, "--plan", d, "--out", out], "--plan"),
        (["emit", MODEL, "--topology", topo, "--strategy", d, "--out", out], "--strategy"),
        (["emit", MODEL, "--topology", topo, "--strategy", "allreduce", "--fusion", d, "--out", out], "--fusion"),
        (["plan", MODEL, "--topology", topo, "--warm-start", d], "--warm-start"),
        (["plan", MODEL, "--topology", topo, "--checkpoint", d], "--checkpoint"),
    ]
    for args, argument in cases:
        assert main(args) == 2, args
        _one_error(capsys, f"{argument}: {d} is a directory")
    assert not tag_home.exists() and not Path(out).exists()


@pytest.mark.slow
def test_a_folder_named_like_a_strategy_does_not_hide_it(tmp_path, monkeypatch, capsys, tag_home):
    topo = str(_topology(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("ps", "dp-nccl"):  # e.g. where `tag emit --strategy ps --out ps` wrote
        (tmp_path / name).mkdir()
        assert main(["simulate", MODEL, "--topology", topo, "--strategy", name]) == 0, name
        assert "iteration" in capsys.readouterr().out.lower()


def test_sfb_strategy_does_not_offer_a_file_it_refuses(tmp_path, capsys, tag_home):
    file = _write(tmp_path, _plan())
    assert main(["sfb", MODEL, "--topology", str(_topology(tmp_path)), "--strategy", str(file)]) == 2
    line = _one_error(capsys, f"--strategy: unknown baseline '{file}'", "give a plan or strategy file with --plan")
    assert "(or a plan .json file)" not in line
    assert not tag_home.exists()
