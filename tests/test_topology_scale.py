"""Large topologies and the fast per-pair matrix reader: the same answers as json, field paths for
NaN and Infinity (timings are in benchmarks/topology_validate.py, not asserted here)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tag_core.cli import main
from tag_core.cluster import load_topology, parse_topology, topology_from_json
from tag_core.cluster.pair_matrix import read_matrix, split_document
from tag_core.errors import TagInputError

ROOT = Path(__file__).resolve().parents[1]


def machines(n: int) -> list[dict]:
    return [{"name": f"m{i}", "gpu": "T4", "count": 1, "intra_gbps": 64} for i in range(n)]


def rack_matrix(n: int, rack: int = 8) -> list[list[float]]:
    """Same-rack pairs 200 Gbps, others 25.5, one slow pair: a realistic per-pair matrix."""
    rows = [[0.0 if i == j else 200.0 if i // rack == j // rack else 25.5 for j in range(n)] for i in range(n)]
    rows[1][n - 1] = rows[n - 1][1] = 12.5
    return rows


def document(n: int, rows, separator: str = ", ") -> str:
    matrix = "[" + ",\n ".join("[" + separator.join(json.dumps(x) for x in row) + "]" for row in rows) + "]"
    return '{"name": "big", "machines": ' + json.dumps(machines(n)) + ', "inter_gbps": ' + matrix + "}"


def by_json(text: str):
    """The reference: the whole document through json, then the same validation."""
    return parse_topology(json.loads(text))


def test_512_machine_matrix_validates_as_json_reads_it(tmp_path):
    n = 512
    text = document(n, rack_matrix(n))
    path = tmp_path / "big.json"
    path.write_text(text)
    topo = load_topology(path)
    data = text.encode()
    assert read_matrix(data, split_document(data)[2], n) is not None  # the fast reader took it
    assert topo == by_json(text) and topo.content_hash() == by_json(text).content_hash()
    assert topo.num_machines == n and topo.inter_gbps == 25.5
    same_rack = n // 8 * (8 * 7 // 2)
    assert len(topo.links) == same_rack + 1  # every same-rack pair, and the slow one
    bandwidth = topo.machine_bandwidth_matrix()
    assert bandwidth[1, n - 1] == 12.5 and bandwidth[0, 7] == 200 and bandwidth[0, 8] == 25.5


def test_cli_validates_a_large_matrix_and_lists_a_screenful_of_links(tmp_path, capsys):
    n = 300
    path = tmp_path / "big.json"
    path.write_text(document(n, rack_matrix(n)))
    assert main(["topology", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{n} machines, {n} devices, inter-machine 25.5 Gbps" in out
    assert "  49  m49 " in out and "m50 " not in out and "... and 250 more machines (--json lists them all)" in out
    assert "... and 993 more (--json lists them all)" in out  # links
    assert len(out.splitlines()) < 130


@pytest.mark.parametrize("token", ["1", "0.5", "100", "12.25", "-0", "0", "99999999999999", "3.1415926535897"])
def test_fast_reader_figures_are_float_exactly(token):
    text = f"[[0, {token}], [{token}, 0]]".encode()
    matrix = read_matrix(text, (0, len(text)), 2)
    assert matrix is not None
    assert matrix.values[0, 1].tobytes() == np.float64(float(token)).tobytes()  # -0 stays -0.0
    assert matrix.original(0, 1) == json.loads(token)


@pytest.mark.parametrize("matrix", [
    "[[0, 1e2], [1e2, 0]]", "[[0, 01], [01, 0]]", "[[0, 1.], [1., 0]]", "[[0, .5], [.5, 0]]",
    "[[0, -], [-, 0]]", "[[0, 1.2.3], [1, 0]]", "[[0, 1 2], [1, 0]]", "[[0, 1], [1, 0], [1, 1]]",
    "[[0, 1], [1]]", "[[0, 1]1, [1, 0]]", "[[0,, 1], [1, 0]]", "[[0, 1], [1, 0],]", "[[0, 1] [1, 0]]",
    "[[0, --1], [1, 0]]", "[[0, 1-], [1, 0]]", "[[0, 1234567890123456], [1, 0]]", "[[0, 1 ], [1, 0]]",
])
def test_fast_reader_declines_what_it_does_not_fully_read(matrix):
    """Declined documents go through json: the same result or error as before."""
    assert read_matrix(matrix.encode(), (0, len(matrix)), 2) is None
    text = '{"name": "x", "machines": ' + json.dumps(machines(2)) + ', "inter_gbps": ' + matrix + "}"
    try:
        expected = ("ok", by_json(text))
    except (TagInputError, ValueError):  # json's own error, or the validation's
        expected = ("error",)
    try:
        got = ("ok", topology_from_json(text, "snap.json"))
    except TagInputError as exc:
        got = ("error",)
        assert "\n" not in str(exc)
    assert got == expected


def test_random_mutations_agree_with_json():
    """Seeded character edits of a small matrix: the fast reader and json accept and refuse alike."""
    rng = random.Random(23)
    for _ in range(400):
        rows = rack_matrix(4, rack=2)
        chars = list(document(4, rows))
        at = "".join(chars).index('"inter_gbps"') + 14
        for _ in range(rng.randint(1, 2)):
            pos = rng.randrange(at, len(chars) - 1)
            edit = rng.choice("0123456789-.,[] e")
            if rng.random() < 0.5:
                chars.insert(pos, edit)
            else:
                chars[pos] = edit
        text = "".join(chars)
        try:
            expected = ("ok", by_json(text))
        except (TagInputError, ValueError):
            expected = ("error",)
        try:
            got = ("ok", topology_from_json(text, "snap.json"))
        except TagInputError:
            got = ("error",)
        assert got == expected, text


@pytest.mark.parametrize("text, where", [
    ('{"name": "x", "machines": [{"name": "a", "gpu": "T4", "count": 1, "intra_gbps": NaN}], "inter_gbps": 1}',
     "machines[0].intra_gbps"),
    ('{"name": "x", "machines": [{"name": "a", "gpu": "T4", "count": 1, "intra_gbps": 1}, '
     '{"name": "b", "gpu": "T4", "count": 1, "intra_gbps": 1}], "inter_gbps": [[0, 5], [Infinity, 0]]}',
     "inter_gbps[1][0]"),
    ('{"name": "x", "machines": [], "inter_gbps": -Infinity}', "inter_gbps"),
    ('{"name": "x", "links": [{"a": "a", "b": "b", "gbps": NaN}], "machines": [], "inter_gbps": NaN}',
     "links[0].gbps"),  # the first in the file
    ('{"name": "x", "machines": [{"name": "a", "gpu": {"name": "G", "tflops": NaN}}], "inter_gbps": 1}',
     "machines[0].gpu.tflops"),
])
def test_nan_and_infinity_name_their_field(tmp_path, text, where):
    path = tmp_path / "snap.json"
    path.write_text(text)
    with pytest.raises(TagInputError) as err:
        load_topology(path)
    assert err.value.where == where
    assert "is not valid JSON" in err.value.problem and str(path) in err.value.problem
    assert "\n" not in str(err.value)


def test_nan_in_a_large_matrix_names_its_cell_on_the_command_line(tmp_path):
    n = 200
    rows = [[json.dumps(x) for x in row] for row in rack_matrix(n)]
    rows[2][150] = "NaN"
    text = document(n, [[0] * n] * n).replace(
        '"inter_gbps": ' + "[" + ",\n ".join("[" + ", ".join(["0"] * n) + "]" for _ in range(n)) + "]",
        '"inter_gbps": ' + "[" + ",\n ".join("[" + ", ".join(row) + "]" for row in rows) + "]")
    path = tmp_path / "nan.json"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "tag_core.cli", "topology", "validate", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("tag: error: inter_gbps[2][150]: NaN is not valid JSON")
    assert proc.stderr.count("\n") == 1


def test_matrix_errors_name_the_same_pair_as_a_pair_by_pair_check():
    n = 300
    rows = rack_matrix(n)
    rows[40][10] = 7.0  # the lower triangle disagrees: reported at [40][10]
    rows[5][30] = rows[30][5] = 1e12  # the upper figure is out of range: earlier in row-major order
    with pytest.raises(TagInputError) as err:
        topology_from_json(document(n, rows), "snap.json")
    assert err.value.where == "inter_gbps[5][30]" and "between" in err.value.problem
    rows[5][30] = rows[30][5] = 25.5
    with pytest.raises(TagInputError) as err:
        topology_from_json(document(n, rows), "snap.json")
    assert err.value.where == "inter_gbps[40][10]"
    assert err.value.problem == "must equal inter_gbps[10][40] (25.5): a link has one bandwidth, got float 7.0"
    rows[40][10] = True
    with pytest.raises(TagInputError) as err:
        parse_topology(json.loads(document(n, rows)))
    assert err.value.where == "inter_gbps[40][10]" and "got boolean true" in err.value.problem
    rows[40][10] = 10**400  # past float's range: refused, not a crash
    with pytest.raises(TagInputError, match=r"inter_gbps\[10\]\[40\]|inter_gbps\[40\]\[10\]"):
        parse_topology({"name": "x", "machines": machines(n), "inter_gbps": rows})


def test_small_blocks_read_and_check_the_same(monkeypatch):
    """Blocks of a few rows (as a 4096-machine matrix is read): the same topology, the same first error."""
    from tag_core.cluster import pair_matrix

    n = 97
    rows = rack_matrix(n)
    text = document(n, rows)
    whole = topology_from_json(text, "snap.json")
    monkeypatch.setattr(pair_matrix, "_BLOCK_BYTES", 1500)
    monkeypatch.setattr(pair_matrix, "_BLOCK_CELLS", 300)
    data = text.encode()
    assert read_matrix(data, split_document(data)[2], n) is not None
    assert topology_from_json(text, "snap.json") == whole == by_json(text)
    rows[90][60] = 5.0  # in a late block
    with pytest.raises(TagInputError) as err:
        topology_from_json(document(n, rows), "snap.json")
    assert err.value.where == "inter_gbps[90][60]"
    rows[90][60], rows[70][3] = 25.5, "x"
    with pytest.raises(TagInputError) as err:
        parse_topology(json.loads(document(n, rows)))
    assert err.value.where == "inter_gbps[70][3]"


def test_8192_gpus_in_racks_round_trip_and_answer_without_a_machine_matrix(tmp_path, capsys):
    """`tag topology random --gpus 8192 --racks 16`: the file validates to the same topology, and the cost
    model's per-level answers for all 2048 machines come from index arrays, never an M x M matrix."""
    import tracemalloc

    from tag_core.cluster import sized_topology
    from tag_core.simulate.comm import CommModel

    out = tmp_path / "r8192.json"
    assert main(["topology", "random", "--gpus", "8192", "--racks", "16", "--out", str(out)]) == 0
    capsys.readouterr()
    topo = load_topology(out)
    assert topo == sized_topology(0, 8192, racks=16) and topo.num_devices == 8192
    assert out.stat().st_size < 400_000  # one line per machine
    comm, every = CommModel(), np.arange(topo.num_machines)
    tracemalloc.start()
    try:
        tiers = comm.allreduce_tiers(topo, every)
        gbps, latency = comm.pair_terms(topo, every, every[::-1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, peak  # an M x M float matrix would be 33 MB
    assert "_machine_matrix" not in topo.__dict__
    assert [t.level for t in tiers] == ["rack", "pod"] and tiers[0].members.tolist() == [128] * 16
    assert set(topo.pair_level(every, every[::-1]).tolist()) == {2}  # machine i and M-1-i: other racks
    assert gbps.tolist() == [topo.rack_uplink.gbps] * len(every) and latency.max() == pytest.approx(
        topo.rack_uplink.latency_us * 1e-6)
