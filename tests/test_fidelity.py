"""Measured steps: `tag run --measure`, the pinned local mode, interleaved measurement and `tag fidelity`.

Every run happens in child processes under a deadline; tests that run graphs carry a pytest timeout too.
No assertion is made on how fast anything runs.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tag_core import store
from tag_core.capture import resolve_model
from tag_core.cli import main
from tag_core.cluster import parse_topology
from tag_core.cluster.calibration import load_from_store
from tag_core.emit import emit, write_emission
from tag_core.plan.measured_error import median_abs_error
from tag_core.runtime import run_emitted
from tag_core.runtime.local_cluster import pinnable_cores
from tag_core.runtime.measure import StepTiming, average_ranks, spearman, tag_against_best
from tag_core.runtime.warmup import MAX_WARMUP_STEPS, WARMUP_STEPS, still_warming

MLP = "mlp[features=12,hidden=16]"
BATCH = 8
LOCAL2 = {"name": "local-2", "inter_gbps": 5.0,
          "machines": [{"name": f"task{k}", "gpu": "cpu", "count": 1, "intra_gbps": 5.0} for k in range(2)]}
two_cores = pytest.mark.skipif(len(pinnable_cores()) < 2, reason="pinned tasks need a core each")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def local2(tmp_path):
    path = tmp_path / "local2.json"
    path.write_text(json.dumps(LOCAL2))
    return path


def _one_line_error(capsys, where: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tag: error: {where}") and "\n" not in err, err
    return err


# ---------------------------------------------------------------- statistics


def test_average_ranks_share_ties():
    assert average_ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([5.0, 5.0, 5.0]) == [2.0, 2.0, 2.0]
    assert average_ranks([]) == []


def test_spearman_against_known_rankings():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties: ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4] give 4.5 / sqrt(4.5 * 5).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    # The textbook example (IQ against hours of TV): rho = -29/165.
    iq = [106, 86, 100, 101, 99, 103, 97, 113, 112, 110]
    tv = [7, 0, 27, 50, 28, 29, 20, 12, 6, 17]
    assert spearman(iq, tv) == pytest.approx(-29 / 165)
    assert spearman([1, 2, 3], [7, 7, 7]) is None  # one side all tied: undefined
    assert spearman([1], [2]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_step_timing_median_and_interquartile_range():
    timing = StepTiming((0.004, 0.001, 0.002, 0.003, 0.100))
    assert timing.median_s == pytest.approx(0.003)
    assert timing.spread_s == pytest.approx(0.004 - 0.002)  # one slow step moves neither
    assert timing.to_dict()["steps"] == 5
    assert median_abs_error([(1.0, 2.0), (3.0, 2.0), (2.0, 2.0)]) == pytest.approx(0.5)
    assert median_abs_error([]) is None


def test_the_bias_by_place_in_the_round_is_each_step_over_its_graphs_median():
    from pathlib import Path

    from tag_core.runtime.interleave import Interleaved, position_bias

    first = Interleaved(Path("a"), seconds=[1.2, 1.0, 1.2, 1.0], positions=[0, 1, 0, 1])  # median 1.1
    second = Interleaved(Path("b"), seconds=[2.0, 2.4, 2.0, 2.4], positions=[1, 0, 1, 0])  # median 2.2
    failed = Interleaved(Path("c"), error="UnavailableError")
    bias = position_bias([first, second, failed])
    assert [b["position"] for b in bias] == [0, 1] and [b["steps"] for b in bias] == [4, 4]
    assert bias[0]["ratio"] == pytest.approx(1.2 / 1.1, rel=0.05) and bias[1]["ratio"] < 1.0
    assert position_bias([Interleaved(Path("d"), seconds=[1.0])]) == []  # steps without places: no bias claimed


def test_tag_against_the_best_alternative_within_the_noise():
    rows = [{"strategy": "single", "measured_s": 1.0, "spread_s": 0.1},
            {"strategy": "dp-nccl", "measured_s": 2.0, "spread_s": 0.5},
            {"strategy": "tag", "measured_s": 1.05, "spread_s": 0.2}]
    verdict = tag_against_best(rows)
    assert verdict["best_alternative"] == "single" and verdict["no_slower_within_noise"]
    assert verdict["noise_s"] == pytest.approx(0.2)
    rows[2]["measured_s"] = 1.5
    assert not tag_against_best(rows)["no_slower_within_noise"]
    assert tag_against_best(rows[:2]) is None


# ---------------------------------------------------------------- the pinned mode and tag run --measure


@two_cores
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pinned_mode_runs_one_process_per_task_and_leaves_none(tmp_path):
    emission = emit(resolve_model(MLP, BATCH), parse_topology(LOCAL2), "allreduce", "cpu")
    out = write_emission(emission, tmp_path / "emitted")
    lines: list[str] = []
    result = run_emitted(out, steps=2, check=True, timeout=120, echo=lines.append)
    assert result.ok, "\n".join(lines)
    assert result.servers == "pinned"
    assert len(result.server_pids) == 2 and len(set(result.server_pids)) == 2 and os.getpid() not in result.server_pids
    assert sorted(result.server_cores) == sorted(pinnable_cores()[:2])
    assert lines[0].startswith("started 2 pinned single-core TF server processes")
    assert "pinned single-core local TF servers" in lines[1]
    assert all(step["passed"] for step in result.steps)  # --check works in this mode too
    deadline = time.monotonic() + 20  # stopped (and reaped) before run_emitted returned; allow the kernel a moment
    while any(_alive(pid) for pid in result.server_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in result.server_pids)
    shared = run_emitted(out, steps=1, timeout=120, servers="shared")  # the in-process servers stay available
    assert shared.ok and shared.servers == "shared" and not shared.server_pids


@two_cores
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_measure_stores_the_step_time_beside_the_prediction(tmp_path, local2, capsys):
    out = tmp_path / "emitted"
    assert main(["emit", MLP, "--topology", str(local2), "--strategy", "dp-nccl", "--device-kind", "cpu",
                 "--batch-size", str(BATCH), "--out", str(out)]) == 0
    prediction = json.loads((out / "plan.json").read_text())["prediction"]
    assert prediction["iteration_time_s"] > 0 and prediction["calibration"] is None
    assert "no calibration" in prediction["uncalibrated_because"] or "no store" in prediction["uncalibrated_because"]
    capsys.readouterr()
    assert main(["run", str(out), "--measure", "--steps", "4", "--warmup", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["servers"] == "pinned" and len(report["steps"]) == 5
    assert report["steps"][0]["warmup"] and not any(s.get("warmup") for s in report["steps"][1:])
    with store.connect(read_only=True) as conn:
        rows = store.load_measured_steps(conn, model=resolve_model(MLP).name)
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row.strategy == "dp-nccl" and row.topology == "local-2" and row.steps == 4 and row.batch_size == BATCH
    assert row.measured_s > 0 and row.spread_s >= 0
    assert row.predicted_s == pytest.approx(prediction["iteration_time_s"])
    assert row.topology_hash == parse_topology(LOCAL2).content_hash() and row.host
    assert report["measurement"]["median_s"] == pytest.approx(row.measured_s)
    # Without --warmup: a few steps and then more until a second has passed, before the timed ones.
    assert main(["run", str(out), "--measure", "--steps", "2", "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    warm = [s for s in steps if s.get("warmup")]
    assert WARMUP_STEPS <= len(warm) <= MAX_WARMUP_STEPS and len(steps) == len(warm) + 2
    assert all(s.get("warmup") for s in steps[:len(warm)])


def test_a_measurement_warms_up_for_a_few_steps_and_a_while():
    assert still_warming(0, 5.0, 3, 1.0) and still_warming(2, 5.0, 3, 1.0)  # fewer than the least
    assert still_warming(3, 0.5, 3, 1.0)  # the while is not over
    assert not still_warming(3, 1.0, 3, 1.0) and not still_warming(MAX_WARMUP_STEPS, 0.1, 3, 1.0)
    assert still_warming(0, 0.0, 1, 0.0) and not still_warming(1, 0.0, 1, 0.0)  # --warmup 1: exactly one


def test_run_measure_bad_input_exits_2_and_writes_nothing(tmp_path, tag_home, capsys):
    (tmp_path / "not_emitted").mkdir()
    assert main(["run", str(tmp_path / "not_emitted"), "--measure"]) == 2
    assert "tag emit" in _one_line_error(capsys, "DIR: ")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(tmp_path / "not_emitted"), "--measure", "--steps", "0"])
    assert exc.value.code == 2
    _one_line_error(capsys, "argument --steps: ")
    assert main(["run", str(tmp_path / "not_emitted"), "--measure", "--check"]) == 2
    _one_line_error(capsys, "--check: ")
    assert main(["run", str(tmp_path / "not_emitted"), "--warmup", "2"]) == 2
    _one_line_error(capsys, "--warmup: ")
    assert not tag_home.exists() or not any(tag_home.iterdir())


# ---------------------------------------------------------------- tag fidelity


def test_fidelity_bad_input_exits_2_and_writes_nothing(tmp_path, tag_home, local2, capsys):
    for argv, where in [(["--strategies", "single,warp-drive"], "argument --strategies: "),
                        (["--strategies", ","], "argument --strategies: "),
                        (["--steps", "0"], "argument --steps: "),
                        (["--rounds", "0"], "argument --rounds: ")]:
        with pytest.raises(SystemExit) as exc:
            main(["fidelity", MLP, "--topology", str(local2), *argv])
        assert exc.value.code == 2
        err = _one_line_error(capsys, where)
        if "warp-drive" in argv[1]:
            assert "'warp-drive'" in err and "model_parallel" in err and "tag" in err
    gpu = tmp_path / "gpus.json"
    gpu.write_text(json.dumps({"name": "g", "inter_gbps": 10, "machines": [{"name": "a", "gpu": "V100-32GB",
                                                                           "count": 2, "intra_gbps": 100}]}))
    assert main(["fidelity", MLP, "--topology", str(gpu)]) == 2
    _one_line_error(capsys, "--topology: ")
    assert main(["fidelity", MLP, "--topology", str(tmp_path / "missing.json")]) == 2
    _one_line_error(capsys, "--topology")
    assert main(["fidelity", "no_such_model", "--topology", str(local2)]) == 2
    _one_line_error(capsys, "model: ")
    assert not tag_home.exists() or not any(tag_home.iterdir())


def test_fidelity_strategy_names_are_canonical():
    from tag_core.cli.fidelity import DEFAULT_STRATEGIES, strategy_list

    assert strategy_list("DP_NCCL, model-parallel,tag,dp-nccl,PS") == ["dp-nccl", "model_parallel", "tag", "ps"]
    assert strategy_list(",".join(DEFAULT_STRATEGIES)) == list(DEFAULT_STRATEGIES)
    assert len(DEFAULT_STRATEGIES) >= 8


@two_cores
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fidelity_runs_two_strategies_end_to_end(local2, capsys):
    assert main(["fidelity", MLP, "--topology", str(local2), "--strategies", "single,duplicate", "--batch-size",
                 str(BATCH), "--steps", "4", "--warmup", "1", "--rounds", "2", "--profile-after", "--calibrate-after",
                 "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [r["strategy"] for r in report["rows"]] == ["single", "duplicate"]
    for row in report["rows"]:
        assert row["predicted_s"] > 0 and row["measured_s"] > 0 and row["spread_s"] >= 0 and row["steps"] == 4
        assert row["predicted_before_s"] > 0  # the prediction from the profile before; predicted_s: from those after
    assert "profiling" in captured.err and "again at batch sizes" in captured.err
    # Profiled again between the two rounds, while the measurement waited, and after it.
    err = captured.err
    assert err.index("round 1 of 2") < err.index("after round 1") < err.index("round 2 of 2") < err.index(
        "after the measurement")
    # How fast each profile ran, per batch size: the one before, after round 1, and after.
    steps = report["profile_steps"]
    assert [s["profile"] for s in steps if s["batch_size"] == BATCH] == ["before", "after round 1", "after"]
    assert all(s["step_s"] > 0 for s in steps)
    # The local tasks calibrated again at the same times; the predictions use one fit of all of it.
    assert err.index("after round 1") < err.index("calibrating 2 local tasks again, after round 1") < \
        err.index("round 2 of 2") < err.index("calibrating 2 local tasks again, after the measurement")
    during = report["calibrations_during"]
    assert [c["calibration"] for c in during] == ["after round 1", "after"]
    assert all(c["step_s_by_tasks"]["1"] > 0 and 0 <= c["compute_overlap"] <= 1 for c in during)
    # One fit of all of it gives the predictions, is stored, and is what the stored measured steps name.
    assert report["calibration"] not in (None, *(c["hash"] for c in during))
    assert report["spearman"] is None or -1.0 <= report["spearman"] <= 1.0
    assert report["median_abs_error"] >= 0 and report["tag_against_best"] is None
    assert report["measured_error"] is None  # no step was measured on local-2 before: the TAG row weighs nothing
    assert "[2/2] duplicate: emitting" in captured.err and "measuring 2 strategies interleaved" in captured.err
    # Each place in the round with its steps' bias (two strategies, two places, 4 steps each over 2 rounds).
    bias = report["position_bias"]
    assert [b["position"] for b in bias] == [0, 1] and sum(b["steps"] for b in bias) == 8
    assert all(b["ratio"] > 0 for b in bias) and "by place in the round" not in captured.err  # --json: no text
    # The profile before against the one after the measurement, said in the report (--profile-after predicts from
    # the profiles after whatever it says).
    drift = report["drift"]
    assert drift["batch_size"] in {s["batch_size"] for s in steps} and drift["before_s"] > 0 and drift["after_s"] > 0
    assert drift["text"] in captured.err and drift["drifted"] == (abs(drift["change"]) > drift["threshold"])
    with store.connect(read_only=True) as conn:
        rows = store.load_measured_steps(conn, topology="local-2")
    assert sorted(rows.strategy) == ["duplicate", "single"] and (rows.measured_s > 0).all()
    assert set(rows.calibration_hash) == {report["calibration"]}
    with store.connect(read_only=True) as conn:
        assert load_from_store(conn, calibration_hash=report["calibration"]).topology == "local-2"
    # The stored rows carry the report's predictions (from the profiles after the rounds), not plan.json's from before.
    reported = {r["strategy"]: r["predicted_s"] for r in report["rows"]}
    assert {r.strategy: r.predicted_s for r in rows.itertuples()} == pytest.approx(reported)


@pytest.mark.slow
def test_by_default_the_model_is_profiled_once_after_the_rounds_and_a_moved_step_is_called_drift(tag_home, local2):
    """What protects a user who passes neither --profile-after nor --calibrate-after."""
    from tag_core.capture.steps import ensure_captured
    from tag_core.cluster.topology_json import load_topology
    from tag_core.profile.profiler import profile_model
    from tag_core.runtime.measurement_window import DRIFT, MeasurementWindow

    own = resolve_model(MLP, BATCH)
    with store.connect() as conn:
        ensure_captured(conn, own)
        before = profile_model(conn, own, [BATCH], runs=2, warmup=1, show_progress=False)
    lines: list[str] = []
    window = MeasurementWindow(own, before, load_topology(local2), False, False, 5, 2, None, lines.append,
                               drift_check=True)
    window(0)
    assert window.profiles is None and not lines  # between the rounds: nothing
    window()
    assert window.profiles is not None and lines == [f"profiling {own.name} again at batch sizes [{BATCH}], "
                                                     "after the measurement"]
    assert window.comm() is None  # no calibration in the window
    drift = window.drift()
    assert drift["batch_size"] == BATCH and drift["before_s"] > 0 and drift["after_s"] > 0
    assert drift["drifted"] == (abs(drift["change"]) > DRIFT)
    assert window.report()["profile_steps"][0]["profile"] == "before"
    # The rule, at the batch size where the step moved most: 30% slower is drift, 5% is not, nor is no profile after.
    window.profile_steps = [{"profile": "before", "batch_size": 4, "step_s": 0.010},
                            {"profile": "before", "batch_size": 8, "step_s": 0.020},
                            {"profile": "after", "batch_size": 4, "step_s": 0.0105},
                            {"profile": "after", "batch_size": 8, "step_s": 0.026}]
    found = window.drift()
    assert found["batch_size"] == 8 and found["drifted"] and found["change"] == pytest.approx(0.3)
    assert "the machine drifted" in found["text"] and "+30%" in found["text"]
    window.profile_steps[3]["step_s"] = 0.021
    assert not window.drift()["drifted"] and "no drift" in window.drift()["text"]
    window.profile_steps = window.profile_steps[:2]
    assert window.drift() is None
