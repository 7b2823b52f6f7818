"""Argument helpers shared by subcommands (not a subcommand itself)."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import TagInputError


def _number(text: str, convert, valid, what: str):
    """`text` as a number that `valid` accepts; argparse reports "must be <what>" otherwise."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "a positive integer")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a positive number")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a non-negative integer")


def positive_int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return sorted(set(values))


def open_store(args, read_only: bool = False):
    from .. import store

    return store.connect(getattr(args, "db", None), read_only=read_only)


def captured_with_profiles(args, spec):
    """(OpGraph, profiles) of `spec`, captured first if needed; a note when only roofline estimates exist."""
    from .. import store
    from ..captures import ensure_captured

    conn = open_store(args)
    try:
        graph = ensure_captured(conn, spec)
        profiles = store.load_profiles(conn, spec.name)
    finally:
        conn.close()
    if profiles.empty:
        print(f"tag: note: no op profiles for {spec.name}; using roofline estimates (run `tag profile {args.model}`)",
              file=sys.stderr)
    return graph, profiles


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def require(condition: bool, where: str, problem: str) -> None:
    if not condition:
        raise TagInputError(where, problem)
