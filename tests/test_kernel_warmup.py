"""`make install` compiles every numba kernel of the simulator into its cache (tag_core.plan.warm_kernels), so that
the first plan after an install searches rather than compiles: each @njit function has its cache index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_warm_up_caches_every_kernel(tmp_path: Path) -> None:
    kernels = set()
    for source in (ROOT / "tag_core").rglob("*.py"):
        kernels |= {(source.stem, name) for name in re.findall(r"@njit\([^)]*\)\s*\ndef (\w+)", source.read_text())}
    assert len(kernels) >= 10
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tag_core.plan.warm_kernels"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("simulator kernels compiled and cached")
    cached = {(m[1], m[2]) for path in tmp_path.rglob("*.nbi") if (m := re.match(r"(\w+)\.(\w+)-\d+\.", path.name))}
    assert kernels - cached == set()
