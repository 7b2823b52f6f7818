"""Import and export `op_profiles` as CSV, so profiles taken on real GPUs elsewhere can be brought in."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pandas as pd

from tag_core import store
from tag_core.cluster.gpu_catalog import CATALOG, CATALOG_BY_LOWER
from tag_core.errors import TagInputError
from tag_core.limits import INT32_MAX

REQUIRED = ["model", "op", "device_type", "batch_size", "run", "time_us"]
OPTIONAL = ["host", "tf_version", "profiled_at", "overhead_us"]
# No op of one training step runs for an hour: a larger time is a unit mistake or a corrupt file, and
# would make the planner's arithmetic overflow (1e30 us planned a 1.7e27x speedup).
MAX_OP_US = 3.6e9


def read_profile_csv(path: str | Path) -> pd.DataFrame:
    """Read and validate a profile CSV; every problem is a TagInputError naming the file, row and column."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TagInputError(where, f"cannot read the file ({type(exc).__name__}: {exc})")
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TagInputError(where, f"not a well-formed CSV ({str(exc).strip().splitlines()[0]})")
    _require_header_width(text, where)  # pandas takes a longer first row and a shorter row
    missing = [column for column in REQUIRED if column not in frame.columns]
    if missing:
        raise TagInputError(where, f"missing column(s) {', '.join(missing)}; need {', '.join(REQUIRED)}")
    unknown = [column for column in frame.columns if column not in REQUIRED + OPTIONAL]
    if unknown:
        raise TagInputError(where, f"unknown column(s) {', '.join(unknown)}")
    if frame.empty:
        raise TagInputError(where, "has a header but no rows")
    rows = []
    for number, record in enumerate(frame.to_dict("records"), start=2):  # line 1 is the header
        rows.append(_validated_row(record, f"{where}:{number}"))
    out = pd.DataFrame(rows)
    duplicated = out.duplicated(["model", "op", "device_type", "batch_size", "run"])
    if duplicated.any():
        line = int(duplicated.idxmax()) + 2
        raise TagInputError(f"{where}:{line}", "repeats a (model, op, device_type, batch_size, run) row")
    return out


def _require_header_width(text: str, where: str) -> None:
    """Every row has the header's number of fields (pandas shifts a longer first row into its index)."""
    rows = csv.reader(io.StringIO(text))
    width = None
    try:
        for fields in rows:
            if not fields:  # a blank line, skipped like pandas does
                continue
            if width is None:
                width = len(fields)
            elif len(fields) != width:
                raise TagInputError(f"{where}:{rows.line_num}", f"has {len(fields)} fields; the header has {width}")
    except csv.Error as exc:
        raise TagInputError(where, f"not a well-formed CSV ({exc})") from None


def _validated_row(record: dict, where: str) -> dict:
    row = {}
    for column in ("model", "op", "device_type"):
        value = record[column].strip()
        if not value:
            raise TagInputError(f"{where}.{column}", "must not be empty")
        row[column] = value
    # The cost model looks device types up by catalog name; the catalog's spelling is stored.
    device = CATALOG_BY_LOWER.get(row["device_type"].lower())
    if device is None:
        raise TagInputError(f"{where}.device_type", f"unknown device type {row['device_type']!r}; known: {', '.join(CATALOG)}")
    row["device_type"] = device.name
    for column, lowest in (("batch_size", 1), ("run", 0)):
        try:
            value = int(record[column])
        except ValueError:
            raise TagInputError(f"{where}.{column}", f"must be an integer, got {record[column]!r}")
        if value < lowest:
            raise TagInputError(f"{where}.{column}", f"must be at least {lowest}, got {value}")
        if value > INT32_MAX:
            raise TagInputError(f"{where}.{column}", f"must be at most {INT32_MAX}, got {value}")
        row[column] = value
    try:
        time_us = float(record["time_us"])
    except ValueError:
        raise TagInputError(f"{where}.time_us", f"must be a number, got {record['time_us']!r}")
    # 0 is a time: the profiler records it for an op the runtime did not run.
    if not (math.isfinite(time_us) and 0 <= time_us <= MAX_OP_US):
        raise TagInputError(f"{where}.time_us", f"must be a finite number of microseconds from 0 to {MAX_OP_US:.1e} "
                                                f"(one hour per op), got {record['time_us']!r}")
    row["time_us"] = time_us
    # The executor's cost beyond the kernel (tag_core.profile.profiler); empty: not measured.
    overhead = (record.get("overhead_us") or "").strip()
    if overhead:
        try:
            value = float(overhead)
        except ValueError:
            raise TagInputError(f"{where}.overhead_us", f"must be a number or empty, got {overhead!r}")
        if not (math.isfinite(value) and abs(value) <= MAX_OP_US):  # negative where tracing added more than the executor spent
            raise TagInputError(f"{where}.overhead_us", f"must be empty or a finite number of microseconds within "
                                                        f"+-{MAX_OP_US:.1e} (one hour per op), got {overhead!r}")
        row["overhead_us"] = value
    else:
        row["overhead_us"] = None
    row["host"] = record.get("host") or None
    row["tf_version"] = record.get("tf_version") or None
    stamp = record.get("profiled_at") or None
    row["profiled_at"] = _timestamp(stamp, where) if stamp else pd.Timestamp.now(tz="UTC").tz_localize(None).to_pydatetime()
    return row


def _timestamp(text: str, where: str):
    """`text` as a naive UTC datetime, as the column stores them: a zone is converted (DuckDB refuses a
    column that mixes zoned and naive times), and NaT ("nan", "NaT") is no time."""
    try:
        stamp = pd.Timestamp(text)
    except ValueError:
        stamp = pd.NaT
    if stamp is pd.NaT:
        raise TagInputError(f"{where}.profiled_at", f"must be a timestamp, got {text!r}")
    if stamp.tzinfo is not None:
        stamp = stamp.tz_convert("UTC").tz_localize(None)
    return stamp.to_pydatetime()


def unknown_rows(conn, rows: pd.DataFrame, source: str | Path, strict: bool = False) -> str | None:
    """Rows whose model the store has not captured, or whose op is not in the model's captured graph:
    None when there are none; with `strict`, a TagInputError naming the first row; else a warning line
    that counts them. (The planner ignores such rows, so they are most likely a typo or a stale file.)"""
    captured = set(store.list_captured_models(conn))
    ops = {model: {op[0] for op in store.op_graph_rows(conn, model)[1]}
           for model in rows["model"].unique() if model in captured}
    no_model = ~rows["model"].isin(captured)
    no_op = pd.Series([model in ops and op not in ops[model] for model, op in zip(rows["model"], rows["op"])],
                      index=rows.index, dtype=bool)
    if not no_model.any() and not no_op.any():
        return None
    first = int((no_model | no_op).idxmax())
    column = "model" if no_model[first] else "op"
    what = (f"model {rows.at[first, 'model']!r} has not been captured" if column == "model"
            else f"op {rows.at[first, 'op']!r} is not in the captured graph of {rows.at[first, 'model']!r}")
    if strict:
        raise TagInputError(f"{source}:{first + 2}.{column}", f"{what} (--strict refuses rows the store does not know)")
    return (f"{int(no_model.sum())} row(s) name a model the store has not captured and {int(no_op.sum())} an op not "
            f"in the model's captured graph (first: {source}:{first + 2}, {what}); imported anyway, "
            "--strict refuses them")


def import_profiles(conn, path: str | Path, strict: bool = False) -> int:
    """Validate the whole file first, then replace the (model, device_type, batch_size) sets it covers.
    With `strict`, rows of a model or op the store does not know are refused too."""
    rows = read_profile_csv(path)
    if strict:
        unknown_rows(conn, rows, path, strict=True)
    return store.replace_profiles(conn, rows)


def export_profiles(conn, model: str | None = None, device_type: str | None = None) -> str:
    """The stored profiles as CSV. A filter that matches nothing is a TagInputError naming it: likely a typo,
    and a header-only export would overwrite an --out file."""
    frame = store.load_profiles(conn, model, device_type)
    if frame.empty and model is not None and (device_type is None or store.load_profiles(conn, model).empty):
        raise TagInputError("--model", f"no profiles stored for model {model!r}")
    if frame.empty and device_type is not None:
        of_model = f" of model {model!r}" if model is not None else ""
        raise TagInputError("--device-type", f"no profiles stored for device type {device_type!r}{of_model}")
    return frame.to_csv(index=False)
