"""The profiling child's allocator limit (issue 21): it reaches TF, binds, and a step over it is profiled anyway."""

from __future__ import annotations

import os
import warnings

import pytest

from tag_core import store
from tag_core.capture import load_op_graph, resolve_model
from tag_core.errors import TagInputError
from tag_core.profile import profile_model
from tag_core.profile.timing import ALLOCATOR_LIMIT_ENV, limit_allocator

# mlp's first kernel (784x256 floats, 0.8 MB) goes to the allocator the limit caps (tensors of 256 KiB and up).
MODEL = "mlp"
TIGHT = 4 * 2**20  # too little for mlp's step; much less makes TF crash instead of raising (a signal is retried too)


def _onednn() -> bool:
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def test_the_limit_goes_to_tfs_environment_and_a_users_own_wins(monkeypatch):
    environ: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", environ)  # this process's own environment stays as it was
    limit_allocator(None)
    assert ALLOCATOR_LIMIT_ENV not in environ
    limit_allocator(123 * 2**20)
    assert environ[ALLOCATOR_LIMIT_ENV] == str(123 * 2**20)
    environ[ALLOCATOR_LIMIT_ENV] = "999"
    limit_allocator(5)
    assert environ[ALLOCATOR_LIMIT_ENV] == "999"


@pytest.mark.slow
def test_a_step_over_the_limit_is_profiled_again_without_it(tag_home, monkeypatch):
    monkeypatch.delenv(ALLOCATOR_LIMIT_ENV, raising=False)  # a limit set here would win over the job's
    if not _onednn():
        pytest.skip("the limit caps TF's oneDNN CPU allocator, which this build does not use")
    spec = resolve_model(MODEL)
    with store.connect() as conn, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = profile_model(conn, spec, [2], runs=1, warmup=0, show_progress=False, allocator_limit=TIGHT)
        ops = len(load_op_graph(conn, spec.name).ops)
    # The limit bound (TF ran out of it) and the second child, without it, measured every op.
    assert any("without the limit" in str(w.message) for w in caught)
    assert len(frame) == ops and set(frame.batch_size) == {2} and set(frame.run) == {0}
    assert (frame.time_us > 0).any()


def test_the_limit_is_checked(tag_home):
    with store.connect() as conn, pytest.raises(TagInputError, match="allocator_limit"):
        profile_model(conn, resolve_model(MODEL), [2], runs=1, show_progress=False, allocator_limit=0)


def test_initialisation_feeds_stay_well_under_an_allocator_limit(monkeypatch):
    from tag_core.profile.profiler import INIT_CHUNK_BYTES
    from tag_core.profile.timing import init_chunk_bytes

    monkeypatch.delenv(ALLOCATOR_LIMIT_ENV, raising=False)
    assert init_chunk_bytes() == INIT_CHUNK_BYTES
    monkeypatch.setenv(ALLOCATOR_LIMIT_ENV, str(TIGHT))
    assert init_chunk_bytes() == TIGHT // 4
    monkeypatch.setenv(ALLOCATOR_LIMIT_ENV, str(1 << 40))  # a limit far above the chunk leaves the chunk
    assert init_chunk_bytes() == INIT_CHUNK_BYTES
