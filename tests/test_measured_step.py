"""`measured_step`: a plan emitted for this machine's cores, run and timed beside its prediction, through
Dagster into DuckDB; its check warns when the prediction is more than 25% off; `tag report` draws the
scatter. Real Dagster, DuckDB and TF; nothing asserts on how fast a step ran."""

from __future__ import annotations

import json
import math
import re
import time

import pytest
from dagster import AssetCheckSeverity, MultiPartitionKey, instance_for_test, materialize

from assets.measurement import CHECK, THRESHOLD, measured_folder, measured_step
from assets.measurement.checks import step_check
from tag_core import store
from tag_core.cli import main
from tag_core.cluster import parse_topology
from tag_core.report.html import measured_section
from tag_core.report.plots import predicted_vs_measured
from tag_core.runtime.local_cluster import pinnable_cores
from tag_core.runtime.measure import step_error, unmeasurable
from tag_pipelines.partitions import model_partitions, topology_partitions
from tag_pipelines.resources import build_resources

MODEL = "mlp[features=12,hidden=16]"
LOCAL2 = {"name": "local2", "inter_gbps": 8, "machines": [
    {"name": f"task{k}", "gpu": "cpu", "count": 1, "intra_gbps": 8} for k in range(2)]}
GPUS = {"name": "gpus", "inter_gbps": 10, "machines": [
    {"name": "a", "gpu": "V100-32GB", "count": 2, "intra_gbps": 100},
    {"name": "b", "gpu": "GTX1080Ti", "count": 2, "intra_gbps": 64}]}
PNG = "data:image/png;base64,"


def _record_topology(snapshot: dict) -> None:
    topology = parse_topology(snapshot)
    with store.connect() as conn:
        store.save_topology_snapshot(conn, topology.name, topology.content_hash(), topology.to_dict(), None)


def _materialize(key: MultiPartitionKey, config: dict | None = None, **kwargs):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(model_partitions.name, [key.keys_by_dimension["model"]])
        instance.add_dynamic_partitions(topology_partitions.name, [key.keys_by_dimension["topology"]])
        return materialize([measured_step], partition_key=key, instance=instance, resources=build_resources(),
                           run_config={"ops": {"measured_step": {"config": config or {}}}}, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_latest_plan_is_measured_here_and_stored_beside_its_prediction(tag_home):
    if len(pinnable_cores()) < 2:
        pytest.skip("two pinned tasks need two cores")
    from tag_core.capture import capture, resolve_model
    from tag_core.plan import plan
    from tag_core.search import Budget

    spec = resolve_model(MODEL)
    topology = parse_topology(LOCAL2)
    planned = plan(capture(spec).graph, topology, None, budget=Budget(iterations=4), num_groups=4).to_dict()
    _record_topology(LOCAL2)
    with store.connect() as conn:
        store.save_plan(conn, "plan-1", planned, source="test", topology_key="local2")
    result = _materialize(MultiPartitionKey({"model": MODEL, "topology": "local2"}), {"steps": 3, "warmup": 1})
    assert result.success

    with store.connect(read_only=True) as conn:
        rows = store.load_measured_steps(conn, topology="local2")
    assert len(rows) == 1
    row = rows.iloc[0]
    assert (row.model, row.topology, row.plan_id, row.steps) == (spec.name, "local2", "plan-1", 3)
    assert row.measured_s > 0 and row.spread_s >= 0 and math.isfinite(row.predicted_s) and row.predicted_s > 0
    # The prediction is the one the emitted folder records, made for CPU devices of this topology.
    folder = measured_folder(spec.name, "local2")
    recorded = json.loads((folder / "plan.json").read_text())
    assert recorded["emission"]["device_kind"] == "cpu" and recorded["emission"]["tasks"] == [1, 1]
    assert row.predicted_s == pytest.approx(recorded["prediction"]["iteration_time_s"])
    assert folder.is_relative_to(tag_home.resolve())

    meta = result.asset_materializations_for_node("measured_step")[0].metadata
    assert meta["measured"].value is True and meta["servers"].value == "pinned"
    assert meta["predicted_ms"].value == pytest.approx(row.predicted_s * 1e3)
    assert meta["measured_ms"].value == pytest.approx(row.measured_s * 1e3)
    assert meta["spread_ms"].value == pytest.approx(row.spread_s * 1e3)
    assert meta["error_pct"].value == pytest.approx((row.predicted_s - row.measured_s) / row.measured_s * 100)
    assert meta["scatter"].value.startswith("![") and PNG in meta["scatter"].value
    assert meta["measurements_on_topology"].value == 1
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == CHECK and check.severity == AssetCheckSeverity.WARN
    assert check.metadata["ran"].value is True
    assert check.passed == (abs(meta["error_pct"].value) <= THRESHOLD * 100)  # whichever it was, consistently


@pytest.mark.slow  # a Dagster run: 5-10 s on a loaded 2-core machine
def test_a_topology_this_machine_cannot_run_is_not_measured_and_says_why(tag_home):
    _record_topology(GPUS)
    result = _materialize(MultiPartitionKey({"model": MODEL, "topology": "gpus"}))
    assert result.success
    meta = result.asset_materializations_for_node("measured_step")[0].metadata
    assert meta["measured"].value is False
    assert "V100-32GB" in meta["why"].value and "tag run --measure --cluster" in meta["why"].value
    (check,) = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["ran"].value is False
    assert check.metadata["reason"].value.startswith("not measured: gpus has")
    with store.connect(read_only=True) as conn:
        assert store.load_measured_steps(conn).empty


@pytest.mark.slow  # a Dagster run: 5-10 s on a loaded 2-core machine
def test_an_unknown_topology_fails_with_one_line(tag_home):
    result = _materialize(MultiPartitionKey({"model": MODEL, "topology": "nowhere"}), raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert "no recorded snapshot" in description and "\n" not in description


def test_unmeasurable_names_what_this_machine_lacks():
    local2 = parse_topology(LOCAL2)
    assert unmeasurable(local2, cores=2) is None
    assert "2 tasks" in unmeasurable(local2, cores=1) and "may use 1 cores" in unmeasurable(local2, cores=1)
    assert "V100-32GB" in unmeasurable(parse_topology(GPUS), cores=64)
    shared = parse_topology({**LOCAL2, "machines": [{**LOCAL2["machines"][0], "count": 2}]})
    assert "more than one device (task0)" in unmeasurable(shared, cores=64)


def _row(predicted_ms: float | None, measured_ms: float, model: str = "mlp", strategy: str = "tag") -> dict:
    return {"model": model, "topology": "local2", "strategy": strategy, "plan_id": None, "graph_hash": None,
            "topology_hash": None, "calibration_hash": None, "batch_size": 8, "steps": 10,
            "predicted_s": None if predicted_ms is None else predicted_ms / 1e3, "measured_s": measured_ms / 1e3,
            "spread_s": 0.5e-3, "host": "here"}


@pytest.mark.parametrize("predicted_ms,measured_ms,passed,words", [
    (10.0, 12.0, True, "predicted within 25% (-16.7%)"),
    (10.0, 14.0, False, "prediction 28.6% too low"),
    (13.0, 10.0, False, "prediction 30.0% too high"),
    (9.0, 10.0, True, "predicted within 25% (-10.0%)"),
])
def test_the_check_warns_beyond_a_quarter_off_on_stored_figures(tag_home, predicted_ms, measured_ms, passed, words):
    with store.connect() as conn:
        store.save_measured_step(conn, _row(predicted_ms, measured_ms))
        stored = store.load_measured_steps(conn).to_dict("records")[0]
    result = step_check(stored)
    assert result.passed is passed and result.severity == AssetCheckSeverity.WARN
    assert result.metadata["verdict"].value.startswith(words)
    assert result.metadata["predicted_ms"].value == pytest.approx(predicted_ms)
    assert result.metadata["measured_ms"].value == pytest.approx(measured_ms)
    assert result.metadata["error_pct"].value == pytest.approx((predicted_ms - measured_ms) / measured_ms * 100)


def test_the_check_passes_without_a_prediction_or_a_measurement(tag_home):
    with store.connect() as conn:
        store.save_measured_step(conn, _row(None, 10.0))
        stored = store.load_measured_steps(conn).to_dict("records")[0]
    assert step_error(stored) is None  # NULL comes back as NaN
    result = step_check(stored)
    assert result.passed and "no prediction" in result.metadata["reason"].value
    skipped = step_check(None, "gpus has V100 machines")
    assert skipped.passed and skipped.metadata["ran"].value is False


def test_the_scatter_draws_predicted_against_measured():
    rows = [_row(10.0, 12.0), _row(13.0, 10.0, strategy="single"), _row(None, 11.0)]
    png = predicted_vs_measured(rows, highlight=0)
    assert png.startswith(b"\x89PNG")
    assert predicted_vs_measured([]).startswith(b"\x89PNG")  # nothing to draw still makes a picture


def test_the_report_shows_the_scatter_when_steps_were_measured(tag_home, tmp_path, capsys):
    with store.connect() as conn:
        assert measured_section(store.load_measured_steps(conn)) == []
        for row in (_row(10.0, 14.0), _row(10.0, 12.0), _row(8.0, 9.0, model="small_cnn")):
            store.save_measured_step(conn, row)
            time.sleep(0.01)  # measured_at orders them: newest first
    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<h2>Predicted against measured</h2>" in page and page.count(PNG) == 1
    assert "3 measured steps" in page
    # The newest of each model, topology and strategy: mlp's second measurement, and small_cnn's.
    cells = re.findall(r"<tr><td>(mlp|small_cnn)</td><td>local2</td><td>tag</td><td>([\d.-]+)</td><td>([\d.]+)</td>",
                       page)
    assert sorted(cells) == [("mlp", "10.00", "12.00"), ("small_cnn", "8.00", "9.00")]
    assert "<td>-16.7%</td>" in page and "<td>-11.1%</td>" in page
