"""Plan history, lineage and the HTML report, from real `tag plan` runs."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from shared_stores import building, copy_store

from tag_core import store
from tag_core.cli import main
from tag_core.report import page_stem

SNAPSHOT = {
    "name": "two-boxes",
    "machines": [
        {"name": "box-a", "gpu": "V100-16GB", "count": 2, "intra_gbps": 100},
        {"name": "box-b", "gpu": "T4", "count": 2, "intra_gbps": 64},
    ],
    "inter_gbps": 25,
}
MODEL = "mlp[features=16,hidden=8]"


@pytest.fixture(scope="module")
def planned_store(tmp_path_factory):
    """Two `tag plan` runs (seeds 0 and 1) into one store, built once for this module."""
    folder = tmp_path_factory.mktemp("report")
    topology = folder / "two.json"
    topology.write_text(json.dumps(SNAPSHOT))
    with building(folder / "tag_home") as home, contextlib.redirect_stdout(io.StringIO()):
        for seed in (0, 1):
            assert main(["plan", MODEL, "--topology", str(topology), "--budget-iterations", "20", "--seed", str(seed),
                         "--groups", "8", "--json"]) == 0
    return home, topology


@pytest.fixture
def planned(planned_store, tag_home):
    home, topology = planned_store
    copy_store(home, tag_home)
    return topology


@pytest.mark.slow
def test_lineage_lists_history_and_changes(planned, capsys):
    assert main(["lineage", MODEL, "two-boxes", "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert len(history) == 2
    assert history[0]["changed"] == ["first plan"] and history[1]["changed"] == ["search seed"]
    assert history[0]["snapshot_file"] == str(planned)
    assert history[0]["graph_is_current"]
    for column in ("graph_hash", "profile_hash", "groups_hash", "topology_hash", "code_version"):
        assert history[-1][column], column


@pytest.mark.slow
def test_lineage_of_an_unknown_pair_exits_2(planned, capsys):
    assert main(["lineage", MODEL, "elsewhere"]) == 2
    assert "no plans for" in capsys.readouterr().err


@pytest.mark.slow
def test_report_has_table_and_pictures(planned, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert MODEL in printed and "two-boxes" in printed and "report:" in printed
    page = (out / "index.html").read_text()
    assert "<img src='speedup.png'" in page and (out / "speedup.png").is_file()
    assert re.search(r"<td>\d+\.\d\d×</td>", page)
    plan_page = out / "plans" / f"{page_stem(MODEL, 'two-boxes')}.html"
    assert f'href="plans/{plan_page.name}"' in page
    for picture in ("speedup", "memory", "heatmap", "gantt"):  # each a PNG beside its page
        assert f"src='{plan_page.stem}-{picture}.png'" in plan_page.read_text()
        assert (plan_page.parent / f"{plan_page.stem}-{picture}.png").is_file()


@pytest.mark.slow
def test_retired_topologies_leave_the_current_plans(planned):
    conn = store.connect()
    assert len(store.current_plans(conn)) == 1
    store.retire_topology(conn, "two-boxes", None)
    assert store.current_plans(conn).empty
    assert len(store.plan_lineage(conn, MODEL, "two-boxes")) == 2, "history stays"
    assert store.plan_lineage(conn, MODEL, "two-boxes").topology_retired_at.notna().all()
    store.reinstate_topology(conn, "two-boxes")
    assert len(store.current_plans(conn)) == 1


@pytest.mark.slow
def test_a_plan_that_cannot_be_drawn_leaves_the_last_report_as_it_was(planned, tmp_path, capsys):
    """A report is many files: when one page fails (here a hand-stored plan whose SFB names a variable the
    graph lacks, drawn after the good plan's page), no file of the new report reaches the folder."""
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}
    conn = store.connect()
    broken = json.loads(store.current_plans(conn).plan.iloc[0])
    broken["strategy"] = {**broken["strategy"], "sfb": {"no_such_variable": [0]}}
    broken["topology"] = "two-boxes-zz"  # its page comes after the good one
    store.save_plan(conn, "broken0000000000", broken, source="test")
    conn.close()
    capsys.readouterr()
    for folder in (out, tmp_path / "fresh"):
        assert main(["report", "--out", str(folder)]) == 2
        assert "no_such_variable" in capsys.readouterr().err
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files} == before  # not even rewritten
    assert sorted(p for p in out.rglob("*") if p.is_file()) == files
    assert not (tmp_path / "fresh").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left beside them
