"""Per-op compute times, measured from TF's own traces, in the runtime's own setting.

In: a captured model (`tag_core.capture`) and batch sizes; or a CSV of profiles taken elsewhere.
Out: rows of (model, op, device_type, batch_size, run, time_us, overhead_us) in DuckDB's `op_profiles`
(the op's traced time, and the executor's cost of running it that traces leave out), the profiled steps as
wholes in `profile_steps`, device types named by the GPU catalog (`tag_core.cluster`); CSV export.
"""

from .csv_files import export_profiles, import_profiles, read_profile_csv
from .profiler import (
    ALLOCATOR_LIMIT_BYTES,
    RUNTIME_THREADS,
    detect_device_type,
    initialise_randomly,
    op_overheads,
    profile_model,
)

__all__ = [
    "ALLOCATOR_LIMIT_BYTES", "RUNTIME_THREADS", "detect_device_type", "export_profiles", "import_profiles",
    "initialise_randomly", "op_overheads", "profile_model", "read_profile_csv",
]
