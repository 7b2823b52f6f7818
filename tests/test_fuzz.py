"""Fuzz the CLI's file inputs: seeded random mutations of the example topologies, a real plan and a real
profile CSV, each fed to the command that reads it, in this process (one subprocess per case would cost
seconds of imports). Every case must

- exit 0 or 2, never raise (an uncaught exception is a traceback for the user);
- on exit 2, print exactly one `tag: error: ...` line, the last on stderr (notes and progress may come
  before it), and leave the store's tables as they were; on exit 0, print no error and valid JSON for --json;
- leave nothing half-written: the --out file or folder absent or complete, no temporary files beside it or
  the store;
- finish within CASE_SECONDS.

Each kind's first cases set one edge value alone (AIMED_*: an unpaired surrogate, a share past float's
range, a zoned timestamp, ...); the rest stack 1-3 random mutations. Case `i` of kind `k` draws from
`random.Random(f"{SEED}-{k}-{i}")`, so any case reruns alone; TAG_FUZZ_SEED picks another seed. A failing
case's input and command line are written to tmp_path/failures/.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import io
import json
import os
import random
import signal
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb
import pytest
from shared_stores import building, copy_store

from tag_core.cli import main

SEED = int(os.environ.get("TAG_FUZZ_SEED", "23"))  # another seed explores further; 23 is the one CI runs
CASES = {"topology": 160, "topology-simulate": 60, "strategy": 100, "sfb": 30, "emit": 30, "warm-start": 40,
         "csv": 160}
CASE_SECONDS = 20.0  # the bound each case must meet
HANG_SECONDS = 60.0  # a case still running then is stopped, so that the rest still run and report
MODEL = "mlp[features=8,hidden=8]"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "topologies"
TESTBED = EXAMPLES / "testbed.json"
CSV_ROWS = 24  # rows of the exported profiles kept in the CSV that is mutated
PLAN_ARGS = ["--budget-iterations", "2", "--groups", "4", "--no-sfb", "--prior", "uniform"]

pytestmark = pytest.mark.slow


# ---- the inputs: a captured, profiled and planned store, built once ----------------------------------


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """MODEL captured, profiled and planned on the testbed: (TAG_HOME, plan JSON text, profile CSV text)."""
    folder = tmp_path_factory.mktemp("fuzz")
    with building(folder / "tag_home") as home, contextlib.redirect_stdout(io.StringIO()):
        plan_file, csv_file = folder / "plan.json", folder / "profiles.csv"
        assert main(["plan", MODEL, "--topology", str(TESTBED), *PLAN_ARGS, "--out", str(plan_file)]) == 0
        assert main(["profiles", "export", "--model", MODEL, "--out", str(csv_file)]) == 0
    lines = csv_file.read_text().splitlines(keepends=True)
    return home, plan_file.read_text(), "".join(lines[:CSV_ROWS + 1])


# ---- JSON mutations ------------------------------------------------------------------------------------

NUMBERS = [0, -1, -0.0, 0.5, 1e-320, 1e308, -1e308, 2**31, 2**63, 2**64, 10**400, float("nan"), float("inf"),
           float("-inf"), 4097, 1025, 1e7, 1e-10]
ODD_VALUES = [None, True, False, "", "text", 0, 1, -3, 1.5, [], {}, [[]], {"a": 1}, "1", "NaN"]
STRINGS = ["", " ", "名前", "nul\x00l", "\ud800", "a\nb", "tab\there", "é" * 100_000, "💥", "\u202eright",
           "V100-16GB", "cpu", "CPU", "m0", "gtx-a", "../../etc/passwd"]


@dataclass
class Document:
    """A JSON value being mutated, and text-level edits applied when it is written out."""

    value: Any
    placeholders: dict[str, str] = field(default_factory=dict)  # marker string -> raw JSON text
    text_edits: list[Callable[[bytes, random.Random], bytes]] = field(default_factory=list)

    def marker(self, raw: str) -> str:
        name = f"@@fuzz-{len(self.placeholders)}@@"
        self.placeholders[name] = raw
        return name

    def dump(self, rng: random.Random) -> bytes:
        text = json.dumps(self.value, ensure_ascii=rng.random() < 0.5)
        for name, raw in self.placeholders.items():
            text = text.replace(json.dumps(name), raw)
        data = text.encode("utf-8", "surrogatepass")
        for edit in self.text_edits:
            data = edit(data, rng)
        return data


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value[:50]):  # long lists (op_groups) stay cheap to walk
            out += _paths(item, prefix + (index,))
    return out


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(doc: Document, path: tuple, new: Any) -> None:
    if not path:
        doc.value = new
    else:
        _get(doc.value, path[:-1])[path[-1]] = new


def _pick(doc: Document, rng: random.Random, under: tuple | None, want=None) -> tuple:
    paths = [p for p in _paths(doc.value) if (want is None or want(_get(doc.value, p)))]
    if under is not None and rng.random() < 0.75:
        inside = [p for p in paths if p[:len(under)] == under]
        paths = inside or paths
    return rng.choice(paths) if paths else ()


def _drop(doc, rng, under):
    path = _pick(doc, rng, under)
    if not path:
        return "drop: nothing"
    parent = _get(doc.value, path[:-1])
    del parent[path[-1]]
    return f"drop {path}"


def _rename(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, dict) and v)
    obj = _get(doc.value, path)
    if not isinstance(obj, dict) or not obj:
        return "rename: nothing"
    key = rng.choice(list(obj))
    new = rng.choice([key.upper(), key + "_", key[:-1], "", "名前", key + "\n", f"{key} "])
    obj[new] = obj.pop(key)
    return f"rename {path + (key,)} -> {new!r}"


def _retype(doc, rng, under):
    path = _pick(doc, rng, under)
    old = _get(doc.value, path)
    new = rng.choice(ODD_VALUES + [[old], str(old)[:100]])
    _set(doc, path, copy.deepcopy(new))
    return f"retype {path} -> {str(new)[:40]!r}"


def _number(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, (int, float)))
    new = rng.choice(NUMBERS)
    _set(doc, path, new)
    return f"number {path} -> {str(new)[:40]}"


def _string(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, str))
    new = rng.choice(STRINGS)
    _set(doc, path, new)
    return f"string {path} -> {new[:20]!r}"


def _empty(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, (list, dict)))
    new = rng.choice([[], {}])
    _set(doc, path, new)
    return f"empty {path} -> {new}"


def _nest(doc, rng, under):
    path = _pick(doc, rng, under)
    depth = rng.choice([30, 1_000, 100_000])
    raw = "[" * depth + json.dumps(_get(doc.value, path)) + "]" * depth
    _set(doc, path, doc.marker(raw))
    return f"nest {path} {depth} deep"


def _duplicate(doc, rng, under):
    """A list element twice (e.g. two machines of one name), or a key twice in one object."""
    path = _pick(doc, rng, under, lambda v: isinstance(v, (list, dict)) and v)
    target = _get(doc.value, path)
    if not isinstance(target, (list, dict)) or not target:
        return "duplicate: nothing"
    if isinstance(target, list):
        target.insert(rng.randrange(len(target) + 1), copy.deepcopy(rng.choice(target)))
        return f"duplicate an element of {path}"
    key = rng.choice(list(target))
    target[doc.marker(json.dumps(key))] = copy.deepcopy(target[key])
    return f"duplicate key {path + (key,)}"


def _grow(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, list) and v)
    target = _get(doc.value, path)
    if not isinstance(target, list) or not target:
        return "grow: nothing"
    target.extend(copy.deepcopy(target[-1]) for _ in range(rng.choice([10, 5_000])))
    return f"grow {path} to {len(target)}"


def _shuffle(doc, rng, under):
    path = _pick(doc, rng, under, lambda v: isinstance(v, list) and len(v) > 1)
    target = _get(doc.value, path)
    if isinstance(target, list):
        rng.shuffle(target)
    return f"shuffle {path}"


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def _bad_bytes(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff\xfe", b"\x80", b"\xc3\x28", b"\x00", b"\xed\xa0\x80"]) + data[at:]


def _text(doc, rng, under):
    edit = rng.choice([_truncate, _bad_bytes,
                       lambda d, r: b"\xef\xbb\xbf" + d,  # a byte-order mark
                       lambda d, r: d + b" trailing",
                       lambda d, r: b"",
                       lambda d, r: b"  \n"])
    doc.text_edits.append(edit)
    return f"text edit {getattr(edit, '__name__', 'lambda')}"


def _top_level(doc, rng, under):
    doc.value = rng.choice([[doc.value], "a string", 42, None, True, [], 1e308])
    return f"top level -> {type(doc.value).__name__}"


# Changes that keep a file valid (or nearly), so that the code past the checks runs on odd but legal input.
FIGURES = [1e-9, 1e-3, 1.0, 3.0, 1e6, 1e7]
SHARES = [0.0, 1e-300, 1e-9, 1.0, 5.0, 1e300]


def _topology_semantic(doc, rng, under):
    topo = doc.value
    if not isinstance(topo, dict) or not isinstance(topo.get("machines"), list) or not topo["machines"]:
        return "topology: nothing"
    machines = [m for m in topo["machines"] if isinstance(m, dict)] or [{}]
    machine = rng.choice(machines)
    n = len(topo["machines"])
    what = rng.choice(["count", "intra", "inter", "gpu", "inline gpu", "link", "matrix", "names", "one machine"])
    if what == "count":
        machine["count"] = rng.choice([1, 2, 64, 1024])
    elif what == "intra":
        machine["intra_gbps"] = rng.choice(FIGURES)
    elif what == "inter":
        topo["inter_gbps"] = rng.choice(FIGURES)
    elif what == "gpu":
        machine["gpu"] = rng.choice(["cpu", "CPU", "t4", "H200-141GB", "a100-80gb", "GTX1080TI"])
    elif what == "inline gpu":
        machine["gpu"] = {"name": rng.choice(["MyGPU", "mygpu", "T4", "名前"]), "tflops": rng.choice(FIGURES[:5]),
                          "mem_gb": rng.choice([1e-9, 0.001, 16, 1e6]), "mem_bw_gbps": rng.choice(FIGURES)}
    elif what == "link":
        a, b = rng.choice(machines).get("name"), rng.choice(machines).get("name")
        topo.setdefault("links", []).append({"a": a, "b": str(b).upper(), "gbps": rng.choice(FIGURES)})
    elif what == "matrix":
        figure = rng.choice(FIGURES)
        topo["inter_gbps"] = [[rng.choice([0, figure]) if i == j else figure for j in range(n)] for i in range(n)]
        topo.pop("links", None)
        if n > 1 and rng.random() < 0.5:
            topo["inter_gbps"][0][n - 1] = rng.choice(FIGURES)  # asymmetric, or a per-pair figure when equal
    elif what == "names":
        rng.choice(machines)["name"] = str(machine.get("name")).upper()
    else:
        del topo["machines"][1:]
    return f"topology {what}"


def _plan_semantic(doc, rng, under):
    plan = doc.value
    strategy = plan.get("strategy", plan) if isinstance(plan, dict) else None
    if not isinstance(strategy, dict) or not isinstance(strategy.get("groups"), list) or not strategy["groups"]:
        return "plan: nothing"
    groups = [g for g in strategy["groups"] if isinstance(g, dict)] or [{}]
    group = rng.choice(groups)
    shares = strategy.get("batch_shares") if isinstance(strategy.get("batch_shares"), list) else []
    ops = strategy.get("op_groups") if isinstance(strategy.get("op_groups"), list) else []
    what = rng.choice(["option", "mask", "share", "op_devices", "op_groups", "new group", "sfb", "fusion",
                       "overlap", "batch", "names", "single group"])
    if what == "option":
        group["option"] = rng.choice(["allreduce", "ps", "duplicate", "model_parallel"])
    elif what == "mask" and isinstance(group.get("mask"), list) and group["mask"]:
        mask = group["mask"]
        choice = rng.choice(["flip", "all", "one"])
        if choice == "flip":
            at = rng.randrange(len(mask))
            mask[at] = 1 - mask[at] if mask[at] in (0, 1) else 1
        else:
            mask[:] = [1] * len(mask) if choice == "all" else [int(i == len(mask) - 1) for i in range(len(mask))]
    elif what == "share" and shares:
        if rng.random() < 0.5:
            shares[rng.randrange(len(shares))] = rng.choice(SHARES)
        else:
            keep = rng.randrange(len(shares))
            shares[:] = [rng.choice(SHARES[1:]) if i == keep else 0.0 for i in range(len(shares))]
    elif what == "op_devices" and ops:
        devices = len(shares) or 1
        strategy["op_devices"] = rng.choice([None, [rng.randrange(-1, devices) for _ in ops], [-1] * len(ops)])
    elif what == "op_groups" and ops:
        ops[:] = [rng.randrange(len(strategy["groups"])) for _ in ops]
    elif what == "new group":
        strategy["groups"].append(copy.deepcopy(group))
        if ops:
            ops[rng.randrange(len(ops))] = len(strategy["groups"]) - 1
    elif what == "sfb":
        strategy["sfb"] = {rng.choice(["dense/kernel", "", "名前", "x"]): rng.sample(range(max(len(ops), 1)), 1)}
    elif what == "fusion":
        strategy["fusion_bytes"] = rng.choice([0, 1, 2**40, 2**62])
    elif what == "overlap":
        strategy["overlap"] = not strategy.get("overlap", True)
    elif what == "batch":
        plan["batch_size"] = rng.choice([1, 2, 3, 7, 1024 * 1024, 2**31 - 1])
    elif what == "names":
        machines = (strategy.get("extra") or {}).get("machines")
        if isinstance(machines, list):
            machines[:] = [str(m).upper() for m in machines]
    elif what == "single group":
        strategy.update(groups=[group], op_groups=None, op_devices=None)
    return f"plan {what}"


JSON_MUTATIONS = [_drop, _rename, _retype, _number, _string, _empty, _nest, _duplicate, _grow, _shuffle,
                  _text, _top_level]
JSON_WEIGHTS = [6, 3, 6, 8, 4, 2, 1, 3, 1, 2, 2, 1]
SEMANTIC_WEIGHT = 25  # about half of all mutations keep the file valid


# Edge values set alone, one per case, before the random cases: (path, value). "\ud800" is written as
# JSON's escape, an unpaired surrogate that json.loads accepts.
AIMED_TOPOLOGY = [(("name",), "x\ud800y"), (("machines", 0, "name"), "\udc00"), (("name",), "a\nb"),
                  (("machines", 0, "gpu"), {"name": "\ud800", "tflops": 1, "mem_gb": 1, "mem_bw_gbps": 1}),
                  (("machines", 0, "gpu"), {"name": "Tiny", "tflops": 1e-9, "mem_gb": 1e-9, "mem_bw_gbps": 1e-9}),
                  (("machines", 0, "count"), 1024), (("inter_gbps",), 1e-9), (("machines", 0, "intra_gbps"), 1e7),
                  (("machines", 1, "name"), "V100-BOX"), (("machines",), []), (("inter_gbps",), [[0]])]
AIMED_PLAN = [(("strategy", "name"), "\ud800"), (("strategy", "extra", "machines", 0), "\ud800"),
              (("model",), "\ud800"), (("topology",), "\udfff"), (("strategy", "sfb"), {"\ud800": [0]}),
              (("strategy", "batch_shares", 0), 10**400), (("strategy", "batch_shares"), [1e308] * 16),
              (("strategy", "batch_shares"), [1e-300] * 16), (("batch_size",), 2**31 - 1),
              (("strategy", "fusion_bytes"), 2**62), (("strategy", "name"), "a\nb"), (("strategy", "version"), 2)]


def mutate_json(value: Any, rng: random.Random, under: tuple | None = None,
                semantic: Callable | None = None, aimed: tuple[tuple, Any] | None = None) -> tuple[bytes, list[str]]:
    """`aimed` (path, value) alone if given, else 1-3 mutations of `value` (mostly inside `under`, when
    given; `semantic` ones too), written out: (bytes, what was done)."""
    doc = Document(copy.deepcopy(value))
    if aimed is not None:
        path, new = aimed
        _set(doc, path, copy.deepcopy(new))
        return json.dumps(doc.value).encode(), [f"set {path} = {str(new)[:40]!r}"]
    mutations, weights = JSON_MUTATIONS + [semantic] * bool(semantic), JSON_WEIGHTS + [SEMANTIC_WEIGHT] * bool(semantic)
    done = [rng.choices(mutations, weights)[0](doc, rng, under) for _ in range(rng.randint(1, 3))]
    return doc.dump(rng), done


# ---- CSV mutations ------------------------------------------------------------------------------------

CELLS = ["", " ", "abc", "1e308", "-1e308", "NaN", "nan", "inf", "-1", "0", "1.5", "2147483648", "9" * 400,
         "0x1F", "1_000", " 7 ", "１２", "\x00", "True", "1e-400", "-0", "3.6e9", "3600000000.5", "2020-13-45",
         "0001-01-01", "9999-12-31 23:59:59", "now", "12345678901234567890", "名前", "a\nb", '"', "T4", "t4",
         "V100", "cpu", "mlp", "Add"]
COLUMN_CELLS = {  # values aimed at one column: mostly well-formed, at its edges
    "profiled_at": ["NaT", "nan", "2020-01-01T00:00:00+05:00", "2020-01-01 00:00:00 UTC", "0001-01-01", "today",
                    "2262-04-12", "9999-12-31"],
    "time_us": ["0", "3600000000", "3.6e9", "1e-320", "-0.0", "0.000001", "4e9"],
    "overhead_us": ["", "-3600000000", "3600000001", "-0"],
    "batch_size": ["1", "2147483647", "2147483648", "0", "2.0", "+3"],
    "run": ["0", "-0", "2147483647", "007"],
    "device_type": ["T4", "t4", "H200-141GB", "CPU", "MyGPU", "V100-16gb"],
    "model": ["mlp", "small_cnn", "MLP[features=8,hidden=8]", "名前"],
    "op": ["NoSuchOp", "", "dense/MatMul", "名前"],
}


AIMED = [(column, value) for column, values in COLUMN_CELLS.items() for value in values]


def _aim(rows: list[list[str]], rng: random.Random, column: str, value: str) -> str:
    """`value` in `column` of one row (the first cases each try one of AIMED, so every one is tried)."""
    if rows and column in rows[0] and len(rows) > 1:
        row = rows[rng.randrange(1, len(rows))]
        row[rows[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _csv_rows(rows: list[list[str]], rng: random.Random) -> tuple[str, str]:
    """One structural change to the rows (header first), written back as CSV text."""
    kind = rng.choice(["drop column", "shuffle columns", "cell", "cell", "cell", "no header", "extra column",
                       "extra field", "short row", "duplicate row", "header only", "rename column"])
    if rows and rows[0] and len(rows) > 1:
        index = rng.randrange(len(rows[0]))
        if kind == "drop column":
            for row in rows:
                del row[index:index + 1]
        elif kind == "shuffle columns":
            order = list(range(len(rows[0])))
            rng.shuffle(order)
            rows[:] = [[row[i] for i in order if i < len(row)] for row in rows]
        elif kind == "cell":
            row = rows[rng.randrange(1, len(rows))]
            index = min(index, len(row) - 1)
            aimed = COLUMN_CELLS.get(rows[0][index] if index < len(rows[0]) else "", [])
            row[index] = rng.choice(aimed if aimed and rng.random() < 0.6 else CELLS)
        elif kind == "no header":
            del rows[0]
        elif kind == "extra column":
            rows[0].append(rng.choice(["extra", "model", "", "overhead_us"]))
            for row in rows[1:]:
                row.append("1")
        elif kind == "extra field":
            rng.choice(rows).append("1")
        elif kind == "short row":
            rng.choice(rows).pop()
        elif kind == "duplicate row":
            rows.insert(rng.randrange(1, len(rows) + 1), list(rng.choice(rows[1:])))
        elif kind == "header only":
            del rows[1:]
        else:
            rows[0][index] = rng.choice(CELLS)
    out = io.StringIO()
    csv.writer(out, lineterminator=rng.choice(["\n", "\r\n"])).writerows(rows)
    return out.getvalue(), kind


CSV_TEXT_EDITS = [_truncate, _bad_bytes, lambda d, r: b"", lambda d, r: b"\xef\xbb\xbf" + d,
                  lambda d, r: d + bytes(r.randrange(256) for _ in range(64)),
                  lambda d, r: d.replace(b",", b";"), lambda d, r: d + b'"unterminated,1\n']


def mutate_csv(text: str, rng: random.Random, aimed: tuple[str, str] | None = None) -> tuple[bytes, list[str]]:
    """`aimed` (column, value) alone if given, else 0-3 changes to the rows, then sometimes one to the bytes:
    (bytes, what was done)."""
    if aimed is not None:  # one edge value alone: nothing else refuses the file first
        text = _aim([list(row) for row in csv.reader(io.StringIO(text))], rng, *aimed)
        return text.encode("utf-8"), [f"{aimed[0]} = {aimed[1]!r}"]
    done = []
    for _ in range(rng.randint(0, 3)):
        try:
            rows = [list(row) for row in csv.reader(io.StringIO(text))]
        except csv.Error:
            break
        text, kind = _csv_rows(rows, rng)
        done.append(kind)
    data = text.encode("utf-8")
    if not done or rng.random() < 0.2:
        edit = rng.choice(CSV_TEXT_EDITS)
        data = edit(data, rng)
        done.append(f"bytes {getattr(edit, '__name__', CSV_TEXT_EDITS.index(edit))}")
    return data, done


# ---- running one case -----------------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised in the command by the alarm: a BaseException, so `except Exception` in the code does not hide it."""


@contextlib.contextmanager
def deadline(seconds: float):
    """SIGALRM after `seconds`, then pytest-timeout's own alarm restored with what is left of it."""
    def fire(signum, frame):
        raise CaseTimeout()

    previous = signal.signal(signal.SIGALRM, fire)
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if remaining:
            signal.setitimer(signal.ITIMER_REAL, max(remaining - (time.monotonic() - start), 0.001), interval)


def store_digest(db: Path) -> dict[str, str]:
    """sha256 of every table's sorted rows."""
    with duckdb.connect(str(db), read_only=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()]
        return {t: hashlib.sha256(repr(conn.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall()).encode())
                .hexdigest() for t in tables}


@dataclass
class Case:
    kind: str
    index: int
    argv: list[str]
    data: bytes
    done: list[str]
    out: Path | None = None  # what --out names, if anything
    json_out: bool = False


def _stream(errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline="", write_through=True)


def _text_of(stream: io.TextIOWrapper) -> str:
    return stream.buffer.getvalue().decode("utf-8", "replace")


def run_case(case: Case) -> tuple[int | None, list[str], float, int]:
    """(exit code or None, problems, seconds, Python warnings)."""
    problems, code = [], None
    # As a terminal's: stdout strict UTF-8, stderr with backslashreplace (Python's own settings).
    out, err = _stream("strict"), _stream("backslashreplace")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with deadline(HANG_SECONDS), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(case.argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
        except CaseTimeout:
            problems.append(f"still running after {HANG_SECONDS:.0f} s")
        except BaseException:
            problems.append("raised:\n" + traceback.format_exc())
    seconds = time.perf_counter() - start
    stdout, stderr = _text_of(out), _text_of(err)
    if seconds > CASE_SECONDS:
        problems.append(f"took {seconds:.1f} s (bound {CASE_SECONDS:.0f} s)")
    if code not in (0, 2, None):
        problems.append(f"exit {code}")
    if "Traceback" in stderr:
        problems.append("a traceback on stderr")
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("tag: error")]
    # The error is one line and the last: a message with a line break in it would leave a tail after it.
    if code == 2 and (len(errors) != 1 or lines[-1] != errors[0]):
        problems.append(f"exit 2 without exactly one error line at the end: {lines[-5:]!r}")
    if code == 0 and errors:
        problems.append(f"exit 0 with an error line: {errors[:5]!r}")
    if code == 0 and case.json_out:
        try:
            json.loads(stdout)
        except ValueError as exc:
            problems.append(f"--json printed no valid JSON ({exc})")
    return code, problems, seconds, len(caught)


def output_problems(case: Case, code: int | None) -> list[str]:
    """--out absent or complete, and no temporary files beside it."""
    if case.out is None:
        return []
    problems = [f"left {p.name}" for p in case.out.parent.iterdir() if p.name != case.out.name]
    if code == 2 and case.out.exists():
        problems.append(f"exit 2 but {case.out.name} was written")
    if code == 0 and case.out.is_dir():  # an emitted folder
        missing = [n for n in ("graph.pb", "cluster.json", "plan.json", "README.txt") if not (case.out / n).is_file()]
        problems += [f"{case.out.name}/ lacks {', '.join(missing)}"] if missing else []
    elif code == 0:
        try:
            json.loads(case.out.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{case.out.name} is not complete JSON ({exc})")
    return problems


# ---- building each kind's cases ---------------------------------------------------------------------------


def make_case(kind: str, index: int, rng: random.Random, folder: Path, db: Path, plan: dict, csv_text: str) -> Case:
    """Case `index` of `kind`: its mutated input written under `folder`, and the command that reads it."""
    out_dir = folder / "out"
    out_dir.mkdir(parents=True)
    edges = AIMED if kind == "csv" else AIMED_TOPOLOGY if kind.startswith("topology") else AIMED_PLAN
    aimed = edges[index] if index < len(edges) else None
    if kind in ("topology", "topology-simulate"):
        base = json.loads(rng.choice(sorted(EXAMPLES.glob("*.json"))).read_text())
        data, done = mutate_json(base, rng, semantic=_topology_semantic, aimed=aimed)
    elif kind == "csv":
        data, done = mutate_csv(csv_text, rng, aimed)
    else:
        bare = rng.random() < 0.2  # a bare strategy file instead of a plan that embeds one
        data, done = mutate_json(plan if aimed or not bare else plan["strategy"], rng, None if bare else ("strategy",),
                                 semantic=_plan_semantic, aimed=aimed)
    source = folder / ("input.csv" if kind == "csv" else "input.json")
    source.write_bytes(data)
    file, store = str(source), ["--db", str(db)]
    json_out = aimed is None and rng.random() < 0.5  # an edge value is printed as text: the harder output
    if kind == "topology":
        return Case(kind, index, ["topology", "validate", file] + ["--json"] * json_out, data, done, None, json_out)
    if kind == "topology-simulate":
        strategy = rng.choice(["dp-nccl", "dp-nccl-p", "horovod", "single", "ps", "model_parallel"])
        argv = store + ["simulate", MODEL, "--topology", file, "--strategy", strategy] + ["--json"] * json_out
        return Case(kind, index, argv, data, done, None, json_out)
    if kind == "strategy":
        argv = store + ["simulate", MODEL, "--topology", str(TESTBED), "--strategy", file] + ["--json"] * json_out
        return Case(kind, index, argv, data, done, None, json_out)
    if kind == "sfb":
        argv = store + ["sfb", MODEL, "--topology", str(TESTBED), "--plan", file] + ["--json"] * json_out
        return Case(kind, index, argv, data, done, None, json_out)
    if kind == "emit":
        out = out_dir / "graph"
        topology = ["--topology", str(TESTBED)] if rng.random() < 0.8 else []
        argv = store + ["emit", MODEL, "--plan", file, *topology, "--device-kind", "cpu", "--out", str(out)]
        return Case(kind, index, argv, data, done, out)
    if kind == "warm-start":
        out = out_dir / "plan.json"
        argv = store + ["plan", MODEL, "--topology", str(TESTBED), *PLAN_ARGS, "--warm-start", file, "--out", str(out)]
        return Case(kind, index, argv, data, done, out)
    argv = store + ["profiles", "import", file] + ["--strict"] * (rng.random() < 0.3)
    return Case(kind, index, argv, data, done)


def record_failure(case: Case, problems: list[str], failures: Path) -> str:
    failures.mkdir(exist_ok=True)
    stem = failures / f"{case.kind}-{case.index}"
    suffix = ".csv" if case.kind == "csv" else ".json"
    stem.with_suffix(suffix).write_bytes(case.data)
    stem.with_suffix(".txt").write_text(f"seed {SEED}, {case.kind} case {case.index}\nmutations: {case.done}\n"
                                        f"argv: {case.argv}\n" + "\n".join(problems) + "\n",
                                        errors="backslashreplace")
    return f"{case.kind} case {case.index} (seed {SEED}; input {stem.with_suffix(suffix)}): " + "; ".join(problems).encode("utf-8", "backslashreplace").decode()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", list(CASES))
def test_mutated_inputs_exit_cleanly(kind, planned, tmp_path, capsys):
    home, plan_text, csv_text = planned
    db = copy_store(home, tmp_path / "store")
    plan = json.loads(plan_text)
    digest = store_digest(db)
    exits, failures, slowest, warned = Counter(), [], 0.0, 0
    for index in range(CASES[kind]):
        rng = random.Random(f"{SEED}-{kind}-{index}")
        case = make_case(kind, index, rng, tmp_path / f"case{index}", db, plan, csv_text)
        code, problems, seconds, caught = run_case(case)
        problems += output_problems(case, code)
        after = store_digest(db)
        changed = sorted(t for t in after if after[t] != digest.get(t))
        if code != 0 and changed:
            problems.append(f"exit {code} but the store's tables changed: {', '.join(changed)}")
        problems += [f"left {p.name} beside the store" for p in db.parent.iterdir() if p.name.endswith(".tmp")]
        digest = after
        exits[code] += 1
        slowest, warned = max(slowest, seconds), warned + bool(caught)
        if problems:
            failures.append(record_failure(case, problems, tmp_path / "failures"))
    with capsys.disabled():
        print(f"\nfuzz {kind}: {CASES[kind]} cases, seed {SEED}, exits {dict(sorted(exits.items(), key=str))}, "
              f"slowest {slowest:.2f} s, {warned} with Python warnings, {len(failures)} failing")
    assert not failures, f"{len(failures)} of {CASES[kind]} {kind} cases failed:\n" + "\n".join(failures[:10])
