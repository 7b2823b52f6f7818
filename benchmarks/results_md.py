"""benchmarks/results.md: each benchmark script owns one `## ` section of it."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.md"
HEADER = "# Benchmark results\n\nEach section is written by the benchmark script it names.\n"


def write_section(heading: str, text: str) -> None:
    """Replace the section that starts with `heading` (up to the next '## '), or append it."""
    current = RESULTS.read_text() if RESULTS.exists() else HEADER
    pattern = re.compile(re.escape(heading) + r".*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text + "\n", current)
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(updated)
