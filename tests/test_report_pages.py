"""The report's pages: one per current plan, every picture a page references exists, idle devices are
folded, and a 60-character model name stays readable (wrapped in pictures and tables, whole as title text).

Plans are real: simgraphs' hand-built training graph, renamed, planned with `tag_core.plan.plan` and stored
as `tag plan` stores them."""

from __future__ import annotations

import dataclasses
import html
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from shared_stores import building, copy_store
from simgraphs import profiles, topology, train_graph

from tag_core import store
from tag_core.capture.steps import save_op_graph
from tag_core.cli import main
from tag_core.plan import plan
from tag_core.report import PlanPictures, page_stem, plan_pictures, short_label
from tag_core.report.plan_plots import used_devices
from tag_core.search import Budget
from tag_core.simulate import Simulator, Strategy

LONG = "a_transformer_with_a_rather_long_descriptive_name[layers=24]"  # 60 characters
SHORT = "tiny"


def _topology():
    """12 devices on 3 machines: the hand-built model leaves most of them idle."""
    return dataclasses.replace(topology(("box-a", "V100-32GB", 4, 100.0), ("box-b", "T4", 4, 50.0),
                                        ("box-c", "T4", 4, 50.0), inter_gbps=10.0), name="three-boxes")


def _store_plan(conn, name: str, layers: int, seed: int) -> dict:
    graph = dataclasses.replace(train_graph(layers=layers), model=name)
    prof = profiles(graph, "cpu", per_sample_us=100.0, constant_us=20.0)
    save_op_graph(conn, graph, None, None, None)
    store.replace_profiles(conn, prof.assign(host="test", tf_version="test", profiled_at=np.datetime64("2026-01-01")))
    data = plan(graph, _topology(), prof, budget=Budget(iterations=8), num_groups=4, seed=seed,
                profile_hash=store.profile_set_hash(conn, name)).to_dict()
    store.save_plan_with_snapshot(conn, f"{name[:4]}{seed:012d}", data, source="test", source_file=None)
    return data


@pytest.fixture(scope="module")
def report_store(tmp_path_factory):
    """Two models (one with a 60-character name) on one topology, two plans of the long one."""
    assert len(LONG) == 60
    home = tmp_path_factory.mktemp("report_pages") / "tag_home"
    with building(home), store.connect() as conn:
        plans = {SHORT: _store_plan(conn, SHORT, 1, 0)}
        _store_plan(conn, LONG, 3, 0)
        plans[LONG] = _store_plan(conn, LONG, 3, 1)
    return home, plans


@pytest.fixture
def report(report_store, tag_home, tmp_path):
    home, plans = report_store
    copy_store(home, tag_home)
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    return out, plans


class _Refs(HTMLParser):
    """The img sources, links and title texts of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "a":
            self.links.append(attrs["href"])
        if attrs.get("title"):
            self.titles.append(attrs["title"])


def _refs(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text())
    return parser


def test_every_current_plan_has_a_page_whose_pictures_exist(report, tag_home):
    out, _ = report
    index = _refs(out / "index.html")
    with store.connect(read_only=True) as conn:
        current = store.current_plans(conn)
    assert len(current) == 2
    pages = [link for link in index.links if link.endswith(".html")]
    assert sorted(pages) == sorted(f"plans/{page_stem(m, t)}.html" for m, t in zip(current.model, current.topology))
    for src in index.images:
        assert (out / src).is_file(), src
    for page in pages:
        refs = _refs(out / page)
        assert len(refs.images) == 4, page  # speedup, memory, heatmap, timeline
        for src in refs.images:
            assert (out / page).parent.joinpath(src).is_file(), src
            assert (out / page).parent.joinpath(src).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for link in refs.links:
            assert (out / page).parent.joinpath(link).resolve().is_file(), link


def test_a_page_shows_its_lineage(report):
    out, plans = report
    page = (out / "plans" / f"{page_stem(LONG, 'three-boxes')}.html").read_text()
    lineage = plans[LONG]["lineage"]
    for value in (lineage["graph_hash"], lineage["profile_hash"], lineage["topology_hash"], "GNN checkpoint",
                  "Calibration", plans[LONG]["calibration"]["why"][:30], "Plans of this model and topology (2)"):
        assert html.escape(str(value)) in page, value
    assert page.count("◀ this plan") == 1


def test_a_long_model_name_is_wrapped_and_whole_as_title(report):
    out, _ = report
    index = (out / "index.html").read_text()
    refs = _refs(out / "index.html")
    assert LONG in refs.titles, "the full name is the title of its shortened cell and link"
    shown = short_label(LONG, 40)
    assert "\n" in shown and all(len(line) <= 40 for line in shown.split("\n"))
    assert shown.replace("\n", "<br>") in index
    page = _refs(out / "plans" / f"{page_stem(LONG, 'three-boxes')}.html")
    assert f"{LONG} on three-boxes" in page.titles


@pytest.mark.parametrize("text", [LONG, "x" * 60, "path/to/models/file.py:build_a_model_with_a_long_name_here"])
def test_short_label_keeps_lines_short(text):
    label = short_label(text, 24, 2)
    lines = label.split("\n")
    assert len(lines) <= 2 and all(len(line) <= 24 for line in lines)
    assert label.replace("\n", "").replace("…", "") in text.replace(" ", "")


def test_pictures_fold_idle_devices(report_store):
    _, plans = report_store
    data = plans[SHORT]
    graph = dataclasses.replace(train_graph(layers=1), model=SHORT)
    prof = profiles(graph, "cpu", per_sample_us=100.0, constant_us=20.0)
    result = Simulator(graph, _topology(), prof, data["batch_size"]).run(Strategy.from_dict(data["strategy"]),
                                                                          timeline=True)
    used = used_devices(result)
    assert 0 < len(used) <= _topology().num_devices
    assert np.all(np.isin(np.unique(result.timeline.compute_device), used))
    pictures = plan_pictures(graph, prof, _topology(), data)
    assert isinstance(pictures, PlanPictures)
    assert set(pictures.named()) == {"heatmap", "gantt", "speedup", "memory"}
    assert all(png[:4] == b"\x89PNG" for png in pictures.named().values())


def test_report_index_links_each_page_once(report):
    out, _ = report
    index = (out / "index.html").read_text()
    assert len(re.findall(r'href="plans/[^"]+\.html"', index)) == 2
