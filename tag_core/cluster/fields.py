"""Checks of JSON-shaped fields: each failure is a TagInputError naming the field's path."""

from __future__ import annotations

import difflib
import math
from typing import Any

from tag_core.errors import TagInputError

# Bounds that keep the cost model's arithmetic finite: far wider than any real cluster (tests and
# what-if studies use tiny figures to force out-of-memory or slow links).
RANGES = {
    "gbps": (1e-9, 1e7, "Gbit/s"),
    "tflops": (1e-9, 1e6, "TFLOP/s"),
    "mem_gb": (1e-9, 1e6, "GB"),
    "mem_bw_gbps": (1e-9, 1e7, "GB/s"),
    "oversubscription": (1.0, 1e6, "(a ratio: demand over uplink capacity)"),
    "latency_us": (1e-6, 1e7, "µs"),
}
MAX_GPUS_PER_MACHINE = 1024
MAX_DEVICES = 16_384


def require(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise TagInputError(where, problem)


def is_positive_int(value: Any) -> bool:
    # bool is an int subclass in Python; True must not pass as a count of 1.
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_positive_number(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an integer past float's range (a 400-digit JSON number)
        return False


def describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return f"{type(value).__name__} {value!r}" if isinstance(value, (int, float)) else type(value).__name__


def json_object(value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    require(isinstance(value, dict), where or "topology", f"must be a JSON object, got {describe(value)}")
    allowed = required + optional
    for key in value:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            require(False, field_path(where, str(key)), f"unknown key (allowed: {', '.join(allowed)}){extra}")
    for key in required:
        require(key in value, field_path(where, key), "missing required field")
    return value


def field_path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def nonempty_string(value: Any, where: str) -> str:
    require(isinstance(value, str) and value.strip() != "", where, f"must be a non-empty string, got {describe(value)}")
    return value.strip()


def bounded_number(value: Any, where: str, kind: str) -> float:
    require(is_positive_number(value), where, f"must be a positive finite number, got {describe(value)}")
    low, high, unit = RANGES[kind]
    require(low <= value <= high, where, f"must be between {low:g} and {high:g} {unit}, got {value:g}")
    return float(value)


def gpu_count(value: Any, where: str) -> int:
    require(is_positive_int(value), where, f"must be a positive integer, got {describe(value)}")
    require(value <= MAX_GPUS_PER_MACHINE, where, f"must be at most {MAX_GPUS_PER_MACHINE} GPUs, got {value}")
    return int(value)
