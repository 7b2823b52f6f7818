"""`tag calibrate`: the fit, the calibration contract (DuckDB and JSON), bad files, and real runs on local
TF servers (pinned processes that never outlive their cluster)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_processes import started_by

from tag_core import store
from tag_core.cli import main
from tag_core.cluster.calibration import (
    MIN_LATENCY_S,
    OVERLAP_KINDS,
    SEND_KINDS,
    Calibration,
    FitRefused,
    Sample,
    fit_calibration,
    fit_latency_bandwidth,
    load_from_store,
    save_to_store,
)
from tag_core.cluster.calibration_json import calibration_to_json, read_calibration_file, write_calibration_file
from tag_core.cluster.topology_json import load_topology
from tag_core.errors import TagInputError

SIZES = (4096, 65536, 2**20, 16 * 2**20, 64 * 2**20)
LATENCY, GBPS = 0.9e-3, 7.8  # what DESIGN.md measured for loopback transfers


def line(latency: float, gbps: float, nbytes: int) -> float:
    return latency + nbytes * 8 / (gbps * 1e9)


def synthetic_samples(noise: float = 0.03, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for kind, link, size, latency, gbps in (("p2p", "inter", 2, LATENCY, GBPS), ("allreduce", "inter", 2, 2e-3, 1.5),
                                            ("allreduce", "inter", 4, 3e-3, 1.0), ("ps", "inter", 2, 1e-3, 4.0),
                                            ("broadcast", "inter", 2, 0.6e-3, 6.0), ("p2p", "intra", 2, 5e-5, 80.0)):
        for nbytes in SIZES:
            for run in range(7):
                seconds = line(latency, gbps, nbytes) * (1 + rng.gauss(0, noise))
                samples.append(Sample(kind, link, size, nbytes, run, seconds))
    for run in range(7):
        samples += [Sample("op", None, None, None, run, 0.5e-6 * (1 + rng.gauss(0, noise))),
                    Sample("step", None, 1, None, run, 0.5e-3), Sample("step", None, 2, None, run, 1.1e-3),
                    Sample("sendrecv", "inter", 2, 4, run, 0.3e-3 * (1 + rng.gauss(0, noise)))]
        # compute 10 ms, transfers 4 ms, both 13 ms: compute hid 1 of the transfers' 4 ms
        samples += [Sample(kind, "inter", 2, None, run, seconds) for kind, seconds in
                    (("overlap_compute", 10e-3), ("overlap_comm", 4e-3), ("overlap_both", 13e-3))]
        samples.append(Sample("gap", "inter", 2, 4096, run, 0.09e-3))  # one more of many independent transfers
        # a tensor sent to a waiting chain: 10.5 ms with the sender idle, 13 ms with it computing: 2.5 ms late
        samples += [Sample("send_idle", "inter", 2, None, run, 10.5e-3),
                    Sample("send_busy", "inter", 2, None, run, 13e-3)]
    return samples


def synthetic_calibration(seed: int = 0) -> Calibration:
    return fit_calibration(synthetic_samples(seed=seed), topology="local-2", topology_hash="0123456789abcdef",
                           source="local", host="here", code_version="0.1.0+test")


def error_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("tag: ")]


# ---------------------------------------------------------------- the fit


def test_fit_recovers_latency_and_bandwidth_exactly_without_noise():
    samples = [Sample("p2p", "inter", 2, b, r, line(LATENCY, GBPS, b)) for b in SIZES for r in range(3)]
    fit = fit_latency_bandwidth(samples, "p2p inter")
    assert fit.latency_s == pytest.approx(LATENCY, rel=1e-9)
    assert fit.gbps == pytest.approx(GBPS, rel=1e-9)
    assert fit.residual_rms_s < 1e-12 and fit.residual_max_rel < 1e-9 and fit.samples == 15


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_latency_and_bandwidth_from_noisy_samples(seed):
    calibration = synthetic_calibration(seed)
    inter = calibration.links["inter"]
    assert inter.latency_s == pytest.approx(LATENCY, rel=0.08)
    assert inter.gbps == pytest.approx(GBPS, rel=0.05)
    assert 0 < inter.residual_max_rel < 0.1 and inter.samples == 35
    assert calibration.collectives["allreduce"]["inter"][4].gbps == pytest.approx(1.0, rel=0.05)
    assert calibration.links["intra"].gbps == pytest.approx(80.0, rel=0.05)
    overheads = calibration.overheads
    assert overheads.per_step_s == 1.1e-3  # the step over the most tasks
    assert overheads.per_op_s == pytest.approx(0.5e-6, rel=0.1)
    assert overheads.per_transfer_s == pytest.approx(0.3e-3, rel=0.1)


@pytest.mark.parametrize("samples, reason", [
    ([Sample("p2p", "inter", 2, 4096, r, 1e-3) for r in range(5)], "1 distinct size"),
    ([Sample("p2p", "inter", 2, b, 0, 1e-3) for b in SIZES], "does not grow with size"),
    ([Sample("p2p", "inter", 2, b, 0, 1e-3 - b * 1e-12) for b in SIZES], "does not grow with size"),
    ([Sample("p2p", "inter", 2, b, 0, b * 1e-9 - 1e-4) for b in SIZES[2:]], "latency"),
    ([Sample("p2p", "inter", 2, None, 0, 1e-3)], "positive byte count"),
])
def test_fit_refuses_samples_that_determine_no_fit(samples, reason):
    with pytest.raises(FitRefused) as refused:
        fit_latency_bandwidth(samples, "p2p inter")
    message = str(refused.value)
    assert message.startswith("p2p inter: ") and reason in message and "\n" not in message


def test_the_clients_feed_is_fitted_through_the_origin_when_its_fixed_cost_vanishes():
    # A feed's fixed cost is inside the step's launch: the measured increments are bytes / bandwidth alone.
    feeds = [Sample("p2p", "client", 1, nbytes, run, line(-2e-5, 2.5, nbytes)) for nbytes in SIZES[1:]
             for run in range(5)]
    calibration = fit_calibration(synthetic_samples() + feeds, topology="t", topology_hash="0" * 16, source="local",
                                  host="", code_version="")
    client = calibration.links["client"]
    assert client.gbps == pytest.approx(2.5, rel=0.1) and client.latency_s == MIN_LATENCY_S
    assert ("p2p", "client", 1, client) in calibration.fits()
    assert calibration.links["inter"].gbps == pytest.approx(GBPS, rel=0.05)  # the other links are untouched
    # Feeds at one size determine no bandwidth: the calibration stands without them (feeds go uncharged).
    one_size = [s for s in feeds if s.bytes == SIZES[1]]
    without = fit_calibration(synthetic_samples() + one_size, topology="t", topology_hash="0" * 16, source="local",
                              host="", code_version="")
    assert "client" not in without.links and set(without.links) == {"inter", "intra"}


def test_the_feeds_latency_leaves_out_the_launchs_jitter():
    # Each feed sample is a fed step less the fastest empty step: 0.4 ms of the launch's spread rides on it.
    feeds = [Sample("p2p", "client", 1, nbytes, run, line(1e-3, 2.5, nbytes)) for nbytes in SIZES[1:]
             for run in range(5)]
    launches = [Sample("step", None, 1, None, run, t) for run, t in enumerate([1.0e-3, 1.2e-3, 1.4e-3, 2.0e-3, 3e-3])]
    others = [s for s in synthetic_samples() if not (s.kind == "step" and s.group_size == 1)]
    fitted = fit_calibration(others + launches + feeds, topology="t", topology_hash="0" * 16, source="local", host="",
                             code_version="").links["client"]
    assert fitted.latency_s == pytest.approx(1e-3 - (1.4e-3 - 1.0e-3), rel=1e-6)
    assert fitted.gbps == pytest.approx(2.5, rel=1e-6)
    # A spread larger than the latency leaves the smallest measurable one.
    wide = [Sample("step", None, 1, None, run, t) for run, t in enumerate([1e-3, 3e-3, 9e-3])]
    assert fit_calibration(others + wide + feeds, topology="t", topology_hash="0" * 16, source="local", host="",
                           code_version="").links["client"].latency_s == MIN_LATENCY_S


def test_the_share_of_transfers_compute_hides_the_gap_and_the_busy_senders_delay_come_from_their_samples():
    assert synthetic_calibration().overheads.compute_overlap == pytest.approx(0.25)
    assert synthetic_calibration().overheads.transfer_gap_s == pytest.approx(0.09e-3)
    assert synthetic_calibration().overheads.busy_send_s == pytest.approx(2.5e-3)  # 13 - max(10.5, compute 10)
    rest = [s for s in synthetic_samples() if s.kind not in ("gap", *OVERLAP_KINDS, *SEND_KINDS)]
    calibration = fit_calibration(rest, topology="t", topology_hash="0" * 16, source="local", host="", code_version="")
    assert calibration.overheads.compute_overlap is None and calibration.overheads.transfer_gap_s is None
    assert calibration.overheads.busy_send_s is None
    assert set(calibration.terms()["overheads"]) == {"per_op_s", "per_step_s", "per_transfer_s"}
    from tag_core.simulate import CommModel

    unmeasured = CommModel.from_calibration(calibration)  # as uncalibrated: compute hides all, links hold whole
    assert unmeasured.compute_overlap == 1.0 and unmeasured.transfer_gap_s is None and unmeasured.busy_send_s == 0
    measured = CommModel.from_calibration(synthetic_calibration())
    assert measured.compute_overlap == pytest.approx(0.25) and measured.transfer_gap_s == pytest.approx(0.09e-3)
    assert measured.busy_send_s == pytest.approx(2.5e-3)
    # A sender that never kept anything waiting measures 0, which exports and imports as measured.
    never = [s for s in synthetic_samples() if s.kind != "send_busy"] + \
        [Sample("send_busy", "inter", 2, None, run, 9e-3) for run in range(7)]
    assert fit_calibration(never, topology="t", topology_hash="0" * 16, source="local", host="",
                           code_version="").overheads.busy_send_s == 0.0


def test_a_file_from_before_the_overlap_was_measured_imports_with_its_hash(tmp_path):
    old = _valid()
    old["samples"] = [x for x in old["samples"] if x["kind"] not in ("gap", *OVERLAP_KINDS, *SEND_KINDS)]
    del old["overheads"]["compute_overlap"], old["overheads"]["transfer_gap_s"], old["overheads"]["busy_send_s"]
    from tag_core.cluster.calibration import calibration_hash

    old["calibration_hash"] = calibration_hash({k: old[k] for k in ("links", "collectives", "overheads")},
                                               old["topology_hash"])
    (tmp_path / "old.json").write_text(json.dumps(old))
    imported = read_calibration_file(tmp_path / "old.json")
    assert imported.overheads.compute_overlap is None and imported.overheads.transfer_gap_s is None
    assert imported.overheads.busy_send_s is None and imported.calibration_hash == old["calibration_hash"]


def test_calibration_needs_point_to_point_and_overheads():
    samples = [s for s in synthetic_samples() if s.kind != "sendrecv"]
    with pytest.raises(FitRefused, match="sendrecv: no samples"):
        fit_calibration(samples, topology="t", topology_hash="0" * 16, source="local", host="", code_version="")


# ---------------------------------------------------------------- DuckDB and JSON


def test_round_trip_through_duckdb_and_json_keeps_terms_bit_for_bit(tmp_path):
    calibration = synthetic_calibration()
    conn = store.connect(tmp_path / "a.duckdb")
    save_to_store(conn, calibration)
    stored = load_from_store(conn, topology="local-2")
    assert load_from_store(conn, calibration_hash=calibration.calibration_hash) == stored
    conn.close()
    assert stored.terms() == calibration.terms()  # floats compared exactly
    assert stored.calibration_hash == calibration.calibration_hash
    assert sorted(stored.samples, key=repr) == sorted(calibration.samples, key=repr)
    assert (stored.topology, stored.topology_hash, stored.source, stored.host, stored.code_version) == \
           ("local-2", "0123456789abcdef", "local", "here", "0.1.0+test")

    write_calibration_file(stored, tmp_path / "c.json")
    imported = read_calibration_file(tmp_path / "c.json")
    assert imported.terms() == calibration.terms() and imported.samples == stored.samples
    assert imported.calibration_hash == calibration.calibration_hash and imported.source == "import"
    conn = store.connect(tmp_path / "b.duckdb")
    save_to_store(conn, imported)
    again = load_from_store(conn)
    conn.close()
    assert again.terms() == calibration.terms() and again.source == "import"


def test_cli_import_then_export(tag_home, tmp_path, capsys):
    write_calibration_file(synthetic_calibration(), tmp_path / "in.json")
    assert main(["calibrate", "--import", str(tmp_path / "in.json"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["links"]["inter"]["gbps"] == pytest.approx(GBPS, rel=0.05)
    assert main(["calibrate", "--export", str(tmp_path / "out.json")]) == 0
    exported = json.loads((tmp_path / "out.json").read_text())
    original = json.loads((tmp_path / "in.json").read_text())
    assert exported["source"] == "import"
    assert {k: v for k, v in exported.items() if k not in ("source", "samples")} == \
           {k: v for k, v in original.items() if k not in ("source", "samples")}
    assert main(["calibrate", "--export", str(tmp_path / "x.json"), "--topology", "elsewhere"]) == 2
    assert error_lines(capsys.readouterr().err) == [
        "tag: error: --topology: no calibration of 'elsewhere' is stored; stored: local-2"]
    assert not (tmp_path / "x.json").exists()


def _valid() -> dict:
    return calibration_to_json(synthetic_calibration())


def _nested(depth: int) -> str:
    return '{"links": ' * depth + "1" + "}" * depth


BAD_FILES = {
    "not JSON": ("{not json", "not valid JSON"),
    "NaN": (json.dumps({**_valid(), "overheads": {**_valid()["overheads"], "per_op_s": float("nan")}}),
            "NaN is not valid JSON"),
    "wrong version": ({**_valid(), "version": 2}, "version: unsupported version 2"),
    "negative bandwidth": ({**_valid(), "links": {**_valid()["links"], "inter": {**_valid()["links"]["inter"],
                                                                                 "gbps": -7.8}}},
                           "links.inter.gbps: must be a positive finite number"),
    "zero latency": ({**_valid(), "overheads": {**_valid()["overheads"], "per_op_s": 0}},
                     "overheads.per_op_s: must be a positive"),
    "unknown key": ({**_valid(), "extra": 1}, "extra: unknown key"),
    "unknown link": ({**_valid(), "links": {"loopback": _valid()["links"]["inter"]}},
                     "links.loopback: unknown link class"),
    "missing field": ({k: v for k, v in _valid().items() if k != "topology_hash"}, "topology_hash: missing required"),
    "missing fit field": ({**_valid(), "collectives": {"allreduce": {"inter": {"2": {"latency_s": 1e-3}}}}},
                          "collectives.allreduce.inter.2.gbps: missing required field"),
    "wrong type": ({**_valid(), "samples": {"kind": "p2p"}}, "samples: must be a list"),
    "bad sample": ({**_valid(), "samples": [{**_valid()["samples"][0], "seconds": "fast"}]},
                   "samples[0].seconds: must be a positive finite number"),
    "boolean count": ({**_valid(), "samples": [{**_valid()["samples"][0], "run": True}]}, "samples[0].run"),
    "group size": ({**_valid(), "collectives": {"ps": {"inter": {"02": _valid()["links"]["inter"]}}}},
                   "collectives.ps.inter.02: a group size"),
    "overlap above 1": ({**_valid(), "overheads": {**_valid()["overheads"], "compute_overlap": 1.5}},
                        "overheads.compute_overlap: must be a number from 0 to 1"),
    "negative gap": ({**_valid(), "overheads": {**_valid()["overheads"], "transfer_gap_s": -1e-4}},
                     "overheads.transfer_gap_s: must be a positive"),
    "negative busy send": ({**_valid(), "overheads": {**_valid()["overheads"], "busy_send_s": -1e-3}},
                           "overheads.busy_send_s: must be a finite number >= 0"),
    "busy send too long": ({**_valid(), "overheads": {**_valid()["overheads"], "busy_send_s": 1e9}},
                           "overheads.busy_send_s: must be at most"),
    "edited terms": ({**_valid(), "overheads": {**_valid()["overheads"], "per_step_s": 1.0}},
                     "calibration_hash: "),
    "wrong format": ({**_valid(), "format": "tag-topology"}, "format: must be 'tag-calibration'"),
    "deep nesting": (_nested(100_000), "nested too deeply"),
    "moderate nesting": (json.dumps({**_valid(), "links": json.loads(_nested(200))}), "links.links: unknown link"),
    "not an object": ("[1, 2]", "calibration: must be a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_calibration_file_is_refused_naming_the_field(case, tag_home, tmp_path, capsys):
    content, expected = BAD_FILES[case]
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["calibrate", "--import", str(path)]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("tag: error: --import") and str(path) in lines[0], lines
    assert expected in lines[0], lines
    assert not (tag_home / "tag.duckdb").exists()  # nothing written: not even an empty store
    with pytest.raises(TagInputError):
        read_calibration_file(path)


def test_local_refuses_too_few_or_too_many_tasks(tag_home, tmp_path, capsys):
    cores = len(os.sched_getaffinity(0))
    out = tmp_path / "local.json"
    for tasks, expected in ((1, "must be at least 2"), (cores + 1, f"this process may use {cores}")):
        assert main(["calibrate", "--local", str(tasks), "--out", str(out)]) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0].startswith("tag: error: --local: ") and expected in lines[0]
    assert main(["calibrate", "--local", "2"]) == 2  # where would the topology go?
    assert "--out: is required" in capsys.readouterr().err
    assert main(["calibrate", "--local", "2", "--out", str(out), "--sizes", "64K"]) == 2
    assert "--sizes: give at least two sizes" in capsys.readouterr().err
    assert not out.exists() and not (tag_home / "tag.duckdb").exists()


@pytest.mark.parametrize("content, expected", [
    ("{oops", "not valid JSON"),
    (json.dumps({"worker": ["a:1", "b:2"]}), 'cluster.worker must be a list of "host:port" strings'),
    (json.dumps({"cluster": {"worker": ["a:1", 7]}}), 'cluster.worker must be a list of "host:port" strings'),
    (json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]}}), "lists 3 workers; the topology has 2 machines"),
])
def test_cluster_mode_refuses_a_bad_cluster_file(content, expected, tag_home, tmp_path, capsys):
    topology = {"name": "pair", "machines": [{"name": f"m{k}", "gpu": "cpu", "count": 1, "intra_gbps": 10.0}
                                             for k in range(2)], "inter_gbps": 10.0}
    (tmp_path / "pair.json").write_text(json.dumps(topology))
    (tmp_path / "cluster.json").write_text(content)
    assert main(["calibrate", "--topology", str(tmp_path / "pair.json"), "--cluster",
                 str(tmp_path / "cluster.json")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("tag: error: --cluster: ") and expected in lines[0], lines
    assert main(["calibrate", "--cluster", str(tmp_path / "cluster.json")]) == 2
    assert "--topology: is required with --cluster" in capsys.readouterr().err
    assert not (tag_home / "tag.duckdb").exists()


def test_devices_of_each_task_prefer_gpus():
    from tag_core.runtime.calibration_client import task_devices

    names = ["/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0",
             "/job:worker/replica:0/task:1/device:GPU:1", "/job:worker/replica:0/task:1/device:GPU:0",
             "/job:client/replica:0/task:0/device:CPU:0"]  # the client's own master: not a task
    assert task_devices(names) == {0: ["/job:worker/task:0/device:CPU:0"],
                                   1: ["/job:worker/task:1/device:GPU:0", "/job:worker/task:1/device:GPU:1"]}


# ---------------------------------------------------------------- local TF servers (real processes)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    state = stat.read_text().split(")")[-1].split()[0] if stat.exists() else "X"
    return state not in ("Z", "X")  # a zombie has ended: only its parent has not reaped it yet


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_cluster_pins_its_servers_and_leaves_none_behind():
    from tag_core.runtime.local_cluster import local_cluster

    with local_cluster(2) as cluster:
        pids = cluster.pids
        assert all(_alive(p) for p in pids)
        assert [os.sched_getaffinity(s.pid) for s in cluster.servers] == [{s.core} for s in cluster.servers]
        assert len({s.core for s in cluster.servers}) == 2
        assert cluster.cluster_spec == {"worker": cluster.addresses}
        assert all(a.startswith("127.0.0.1:") for a in [*cluster.addresses, cluster.client])
        assert json.loads(cluster.client_cluster) == {"worker": cluster.addresses, "client": [cluster.client]}
        assert cluster.client_args() == ["--target", cluster.target(0), "--client-cluster", cluster.client_cluster]
    assert not any(_alive(p) for p in pids)

    with pytest.raises(RuntimeError, match="the body failed"):
        with local_cluster(2) as cluster:
            pids = cluster.pids
            raise RuntimeError("the body failed")
    assert not any(_alive(p) for p in pids)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_servers_exit_when_the_process_that_started_them_is_killed(tmp_path):
    script = ("import json\nfrom tag_core.runtime.local_cluster import local_cluster\n"
              "with local_cluster(2) as c:\n    print(json.dumps(c.pids), flush=True)\n"
              "    import time; time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(parent.stdout.readline())
        assert all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)  # no finally, no context manager exit: only the servers' own watch
        parent.wait()
    assert _gone_within(pids, 10.0)


def _listening(ports: set[int], proc: str = "/proc") -> dict[int, set[str]]:
    """Local addresses listening on `ports`, from /proc/net/tcp and tcp6 (what `ss -ltn` reads) of the network
    namespace of `proc` (/proc: this process's, /proc/PID: that process's)."""
    found: dict[int, set[str]] = {}
    for table, width in ((f"{proc}/net/tcp", 8), (f"{proc}/net/tcp6", 32)):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and int(port, 16) in ports:  # 0A: LISTEN
                if width == 8:
                    text = ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    text = "::" if set(address) == {"0"} else ("::1" if address.endswith("01000000") and
                                                                set(address[:24]) == {"0"} else address)
                found.setdefault(int(port, 16), set()).add(text)
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_listening_sockets_of_a_local_cluster(capsys):
    """TF's gRPC server binds "0.0.0.0:port" (hard-coded in grpc_server_lib), so a local cluster's servers run
    in a network namespace of their own whose only interface is lo (tag_core.runtime.loopback): there they
    listen on every interface, that is on its loopback; this machine's own namespace has none of the ports."""
    from tag_core.runtime.local_cluster import local_cluster

    with local_cluster(2) as cluster:
        ports = {int(a.rsplit(":", 1)[1]) for a in cluster.addresses}
        inside = _listening(ports, f"/proc/{cluster.pids[0]}")
        interfaces = Path(f"/proc/{cluster.pids[0]}/net/dev").read_text()
        outside = _listening(ports)
    assert set(inside) == ports  # every server listens, in the one namespace of the cluster
    assert all(addresses <= {"127.0.0.1", "::1", "0.0.0.0", "::"} for addresses in inside.values())
    with capsys.disabled():
        print(f"\nlocal cluster sockets: {inside} in its namespace, {outside or 'none'} on this machine")
    if cluster.isolated:
        assert outside == {}
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
    else:  # TAG_NETNS=off or prefer without namespaces: open on every interface, as the warning said
        assert outside == inside


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_calibration_on_two_local_servers(tag_home, tmp_path, capsys):
    out = tmp_path / "local.json"
    # Five repeats: the client's feed is fitted from two sizes, and with three a busy machine's noise could leave
    # no growth with size to fit (the optional link is then left out).
    assert main(["calibrate", "--local", "2", "--out", str(out), "--sizes", "4K,256K,4M", "--repeats", "5",
                 "--warmup", "1", "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    topology = load_topology(out)
    assert [m.name for m in topology.machines] == ["task0", "task1"] and topology.num_devices == 2
    assert topology.machines[0].gpu.name == "cpu" and topology.name == "local-2"
    inter = summary["links"]["inter"]
    assert topology.inter_gbps == float(f"{inter['gbps']:.4g}")
    assert summary["topology_hash"] == topology.content_hash()
    assert set(summary["collectives"]) == {"allreduce", "ps", "broadcast"}
    assert summary["links"]["client"]["gbps"] > 0  # the client's feed to task 0, from 256 KB up
    assert all(set(summary["collectives"][k]["inter"]) == {"2"} for k in summary["collectives"])
    overheads = summary["overheads"]
    assert all(overheads[k] > 0 for k in ("per_op_s", "per_step_s", "per_transfer_s"))
    assert 0 <= overheads["compute_overlap"] <= 1  # measured: compute on both tasks beside transfers between them
    assert overheads["transfer_gap_s"] > 0
    assert overheads["busy_send_s"] >= 0  # measured: a tensor sent to a waiting task, its sender idle or computing
    assert {(m["kind"], m["bytes"]) for m in summary["measured"]} >= {("p2p", 4096), ("p2p", 4 * 2**20), ("op", None)}
    assert {m["bytes"] for m in summary["measured"] if m.get("link") == "client"} == {256 * 2**10, 4 * 2**20}
    assert all(m["runs"] == (15 if m["kind"] in (*OVERLAP_KINDS, *SEND_KINDS) else 5) for m in summary["measured"])
    conn = store.connect(tag_home / "tag.duckdb", read_only=True)
    stored = load_from_store(conn, topology="local-2")
    conn.close()
    assert stored.calibration_hash == summary["calibration_hash"] and stored.source == "local"
    assert len(stored.samples) == sum(m["runs"] for m in summary["measured"])
    assert main(["topology", "validate", str(out)]) == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_calibrating_a_cluster_whose_other_task_serves_from_its_own_command(tag_home, tmp_path, capsys):
    from tag_core.runtime.local_cluster import free_loopback_port

    addresses = [f"127.0.0.1:{free_loopback_port()}" for _ in range(2)]
    (tmp_path / "cluster.json").write_text(json.dumps({"cluster": {"worker": addresses}}))
    topology = {"name": "pair", "machines": [{"name": f"m{k}", "gpu": "cpu", "count": 1, "intra_gbps": 10.0}
                                             for k in range(2)], "inter_gbps": 10.0}
    (tmp_path / "pair.json").write_text(json.dumps(topology))
    common = ["--topology", str(tmp_path / "pair.json"), "--cluster", str(tmp_path / "cluster.json")]
    tag = str(Path(sys.executable).parent / "tag")
    server = subprocess.Popen([tag, "calibrate", *common, "--task-index", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert main(["calibrate", *common, "--sizes", "4K,4M", "--repeats", "3", "--warmup", "1", "--quiet",
                     "--json"]) == 0
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    summary = json.loads(capsys.readouterr().out)
    assert summary["source"] == "cluster" and summary["topology"] == "pair"
    assert summary["topology_hash"] == load_topology(tmp_path / "pair.json").content_hash()
    assert summary["links"]["inter"]["gbps"] > 0


def _measuring_children() -> list[int]:
    """Processes of tag_core.runtime.calibration_client that this test process started."""
    return [pid for pid, _ in started_by("tag_core.runtime.calibration_client")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_measurement_whose_servers_die_is_stopped_and_leaves_nothing_behind():
    from tag_core.runtime.calibrate import CalibrationError, CalibrationSettings, measure
    from tag_core.runtime.local_cluster import local_cluster

    def kill_servers(event: dict) -> None:
        if event["event"] == "round" and event["index"] == 1:  # mid-measurement: the next step waits for gone servers
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(CalibrationError):
        with local_cluster(2) as cluster:
            pids = cluster.pids
            measure(cluster.client_args(), 2, CalibrationSettings(step_timeout_s=3.0), progress=False, grace_s=2.0,
                    on_event=kill_servers)
    assert not any(_alive(p) for p in pids)
    assert _measuring_children() == []
